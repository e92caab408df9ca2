package citus

import (
	"fmt"
	"testing"
)

func TestSplitByGroup(t *testing.T) {
	// Items are "group" or "?" (unknown); the value after the colon keeps
	// their order visible.
	of := func(s string) (int32, bool) {
		var g int32
		if s[0] == '?' {
			return 0, false
		}
		fmt.Sscanf(s, "%d", &g)
		return g, true
	}
	for _, c := range []struct {
		in   []string
		want string
	}{
		{nil, "[]"},
		{[]string{"1:a", "1:b"}, "[]"},
		{[]string{"?:a", "?:b"}, "[]"},
		{[]string{"1:a", "2:b", "1:c", "?:d", "0:e", "2:f"}, "[[1:a 1:c] [2:b 2:f] [?:d] [0:e]]"},
		{[]string{"?:a", "0:b"}, "[[?:a] [0:b]]"}, // unknown is not group 0
	} {
		got := SplitByGroup(c.in, of)
		if s := fmt.Sprint(got); (got == nil && c.want != "[]") || (got != nil && s != c.want) {
			t.Errorf("SplitByGroup(%v) = %v, want %s", c.in, got, c.want)
		}
	}
}
