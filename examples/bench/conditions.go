//go:build unix

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// conditions is what a run ran on, printed before its figures and kept in
// bench.json: on a shared or virtual machine the same code gives different
// absolute figures from one hour to the next, and these say why.
type conditions struct {
	CPUs int `json:"cpus"`
	// StealPct is the share of all CPU time (every CPU, /proc/stat) that
	// the hypervisor gave to other guests over the run; -1 when unknown.
	StealPct     float64 `json:"steal_pct"`
	LoadAvgStart string  `json:"loadavg_start"`
	LoadAvgEnd   string  `json:"loadavg_end"`
	// SyncStart and SyncEnd are the fdatasync probe at the start and the
	// end of the run.
	SyncStart *syncProbe `json:"fdatasync_start,omitempty"`
	SyncEnd   *syncProbe `json:"fdatasync_end,omitempty"`

	stat0 []int64
}

// syncProbe is pg_test_fsync's one-8-KiB-write case: write 8 KiB at the
// start of a file and fdatasync it, syncProbeOps times, in a directory on
// the data directory's filesystem. A commit with synchronous_commit on
// waits for about one of these, so it bounds commits per second per WAL
// flush.
type syncProbe struct {
	Dir    string  `json:"dir"`
	Ops    int     `json:"ops"`
	PerSec float64 `json:"ops_per_sec"`
	P50us  float64 `json:"p50_us"`
	P99us  float64 `json:"p99_us"`
	Err    string  `json:"error,omitempty"`
}

const syncProbeOps = 200

// cpuStat returns the aggregate "cpu" line of /proc/stat as numbers (user
// nice system idle iowait irq softirq steal ...), nil when unreadable.
func cpuStat() []int64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return nil
	}
	out := make([]int64, 0, len(f)-1)
	for _, s := range f[1:] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil
		}
		out = append(out, v)
	}
	return out
}

// stealPct is steal / total between two cpuStat readings, in percent. Total
// is the first eight fields: guest and guest_nice are already inside user
// and nice.
func stealPct(a, b []int64) float64 {
	if len(a) < 8 || len(b) < 8 {
		return -1
	}
	var total int64
	for i := range 8 {
		total += b[i] - a[i]
	}
	if total <= 0 {
		return -1
	}
	return 100 * float64(b[7]-a[7]) / float64(total)
}

// probeSync runs the fdatasync probe in dir.
func probeSync(dir string) *syncProbe {
	p := &syncProbe{Dir: dir}
	f, err := os.CreateTemp(dir, "bench-fdatasync-*")
	if err != nil {
		p.Err = err.Error()
		return p
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 8<<10)
	for i := range buf {
		buf[i] = byte(i)
	}
	// Allocate the block first, as pg_test_fsync does, so the probe times
	// overwrites (like WAL segments, which are preallocated).
	if _, err := f.WriteAt(buf, 0); err != nil {
		p.Err = err.Error()
		return p
	}
	if err := f.Sync(); err != nil {
		p.Err = err.Error()
		return p
	}
	lat := make([]time.Duration, 0, syncProbeOps)
	start := time.Now()
	for range syncProbeOps {
		t := time.Now()
		if _, err := f.WriteAt(buf, 0); err != nil {
			p.Err = err.Error()
			return p
		}
		if err := fdatasync(f); err != nil {
			p.Err = err.Error()
			return p
		}
		lat = append(lat, time.Since(t))
	}
	el := time.Since(start)
	slices.Sort(lat)
	p.Ops = len(lat)
	p.PerSec = float64(len(lat)) / el.Seconds()
	p.P50us = float64(pct(lat, 50)) / float64(time.Microsecond)
	p.P99us = float64(pct(lat, 99)) / float64(time.Microsecond)
	return p
}

func (p *syncProbe) String() string {
	if p == nil {
		return "not run"
	}
	if p.Err != "" {
		return "failed: " + p.Err
	}
	return fmt.Sprintf("%s ops/s, p50 %.0f µs, p99 %.0f µs (%d × 8 KiB write + fdatasync in %s)", fmtInt(p.PerSec), p.P50us, p.P99us, p.Ops, p.Dir)
}

// probeDir is a directory on the data directory's filesystem: the data
// directory's parent when it is ours (the self-started cluster keeps its
// socket there too), else the temp dir.
func probeDir(dataDir string) string {
	if dataDir != "" {
		if d := filepath.Dir(dataDir); writable(d) {
			return d
		}
		if writable(dataDir) {
			return dataDir
		}
	}
	return os.TempDir()
}

func writable(dir string) bool {
	f, err := os.CreateTemp(dir, "bench-probe-*")
	if err != nil {
		return false
	}
	f.Close()
	os.Remove(f.Name())
	return true
}

// startConditions reads the start of the run's conditions and prints them.
func startConditions(dataDir string) *conditions {
	c := &conditions{CPUs: runtime.NumCPU(), StealPct: -1, LoadAvgStart: loadAvg(), stat0: cpuStat()}
	c.SyncStart = probeSync(probeDir(dataDir))
	fmt.Printf("ran on: %d CPUs, load average %s, fdatasync %s\n", c.CPUs, c.LoadAvgStart, c.SyncStart)
	return c
}

// end reads the end of the run's conditions and prints them all.
func (c *conditions) end(dataDir string) {
	c.StealPct = stealPct(c.stat0, cpuStat())
	c.LoadAvgEnd = loadAvg()
	c.SyncEnd = probeSync(probeDir(dataDir))
	steal := "unknown"
	if c.StealPct >= 0 {
		steal = fmt.Sprintf("%.1f%%", c.StealPct)
	}
	fmt.Printf("ran on: %d CPUs; CPU steal over the run %s; load average (1, 5, 15 min) at start %s, at end %s\n",
		c.CPUs, steal, c.LoadAvgStart, c.LoadAvgEnd)
	fmt.Printf("  fdatasync at start: %s\n  fdatasync at end:   %s\n", c.SyncStart, c.SyncEnd)
}
