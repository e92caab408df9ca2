package queenui

import (
	"testing"
	"time"
)

// TestRates: a rate needs two samples at least rateMin apart; a total that
// went down (a purged partition) gives no rate.
func TestRates(t *testing.T) {
	var r rates
	t0 := time.Unix(1000, 0)
	if got := r.update(t0, map[string]int64{"a": 10, "b": 50}); got != nil {
		t.Fatalf("first sample: %v, want none", got)
	}
	if got := r.update(t0.Add(time.Second), map[string]int64{"a": 11, "b": 50}); got != nil {
		t.Fatalf("sample after 1s: %v, want none yet", got)
	}
	got := r.update(t0.Add(4*time.Second), map[string]int64{"a": 30, "b": 40, "c": 5})
	if len(got) != 1 || got["a"] != 5 {
		t.Fatalf("rates %v, want a: 5/s only", got)
	}
	// Within rateMin of the last sample: the last rates again.
	if again := r.update(t0.Add(5*time.Second), map[string]int64{"a": 1000}); again["a"] != 5 {
		t.Fatalf("rates %v within rateMin, want the previous ones", again)
	}
}

func TestFormat(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0s", 1500 * time.Microsecond: "2ms", 61 * time.Second: "1m1s", 90 * time.Minute: "1h30m0s",
		50 * time.Hour: "2d2h", -time.Second: "0s",
	} {
		if got := dur(d); got != want {
			t.Errorf("dur(%v) = %q, want %q", d, got, want)
		}
	}
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 5 << 20: "5.0 MiB"} {
		if got := byteSize(n); got != want {
			t.Errorf("byteSize(%d) = %q, want %q", n, got, want)
		}
	}
	for r, want := range map[float64]string{-1: "–", 0: "0/s", 2.34: "2.3/s", 123.4: "123/s"} {
		if got := rate(r); got != want {
			t.Errorf("rate(%v) = %q, want %q", r, got, want)
		}
	}
}
