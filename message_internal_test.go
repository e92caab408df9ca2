package queen

import (
	"bytes"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
)

// The ids of one call are version 7 with the RFC 9562 variant, sort in
// minting order, never repeat, and sort before the ids of a later call,
// also across the rare roll-over of the counted bits.
func TestIDMinter(t *testing.T) {
	check := func(prev, id uuid.UUID) {
		t.Helper()
		if id.Version() != uuid.V7 || id.Variant() != uuid.VariantRFC9562 {
			t.Fatalf("%s: version %d, variant %d", id, id.Version(), id.Variant())
		}
		if bytes.Compare(prev[:], id[:]) >= 0 {
			t.Fatalf("%s does not sort after %s", id, prev)
		}
	}
	before := time.Now().Add(-time.Millisecond)
	var prev uuid.UUID
	seen := map[uuid.UUID]bool{}
	for call := range 3 {
		var m idMinter
		if call == 2 {
			// The counted bits are about to run out.
			if _, err := m.next(); err != nil {
				t.Fatal(err)
			}
			m.rand = randBits - 2
		}
		for range 5000 {
			id, err := m.next()
			if err != nil {
				t.Fatal(err)
			}
			check(prev, id)
			if seen[id] {
				t.Fatalf("%s minted twice", id)
			}
			seen[id] = true
			prev = id
		}
	}
	ts, err := uuid.TimestampFromV7(prev)
	if err != nil {
		t.Fatal(err)
	}
	if at, _ := ts.Time(); at.Before(before) || at.After(time.Now().Add(time.Second)) {
		t.Fatalf("last id stamped %v, minted after %v", at, before)
	}
}

// A minted id's text is uuid.UUID.String's, whatever chunk it comes from,
// and a text stays what it was as later ones fill its chunk and the next.
func TestIDTextsAreCanonicalAndStay(t *testing.T) {
	var (
		ids   idMinter
		texts idTexts
		got   []string
		want  []string
	)
	const n = 3*idTextChunk + 5
	for i := range n {
		id, err := ids.next()
		if err != nil {
			t.Fatal(err)
		}
		if i == 7 {
			id = uuid.Max // every nibble f
		}
		if i == 8 {
			id = uuid.Nil
		}
		got = append(got, texts.text(id, n-i))
		want = append(want, id.String())
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("text %d = %q, want %q", i, got[i], want[i])
		}
	}
}
