//go:build !unix

package fusion

func cpuTime() (ns int64, ok bool) { return 0, false }
