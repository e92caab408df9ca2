package stmt

import (
	"strings"
	"testing"
)

// Every valid schema name gets a channel PostgreSQL accepts as is, short
// names keep their readable form, and long names sharing a prefix differ.
func TestChannelFitsIdentifier(t *testing.T) {
	if got := New("queen").Channel; got != "queen_queen" {
		t.Fatalf("channel of queen = %q", got)
	}
	seen := map[string]bool{}
	for n := 1; n <= 63; n++ {
		for _, last := range []string{"a", "b"} {
			schema := strings.Repeat("s", n-1) + last
			c := New(schema).Channel
			if len(c) > maxIdentifier {
				t.Fatalf("schema of %d bytes: channel %q is %d bytes", n, c, len(c))
			}
			if seen[c] {
				t.Fatalf("schema %q: channel %q repeats another schema's", schema, c)
			}
			seen[c] = true
		}
	}
}
