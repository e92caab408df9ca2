//go:build unix

package main

import (
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// cpuSeconds is this process's user+system CPU time (getrusage).
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// clockTicks is USER_HZ, 100 on every Linux this runs on.
const clockTicks = 100

// serverTicks returns utime+stime (in clock ticks) of the postmaster and
// each of its children (backends and auxiliary processes), by pid, from
// /proc; nil when it cannot tell (no pid, not Linux).
func serverTicks(postmaster int) map[int]int64 {
	if postmaster <= 0 {
		return nil
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	out := map[int]int64{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// The command name may hold spaces; fields resume after its ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		// f[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		if pid != postmaster && ppid != postmaster {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		out[pid] = ut + st
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// serverCPU measures the CPU time the server spends during a scenario. It
// samples every 250 ms so that short-lived processes (autovacuum workers,
// River's or queen's reconnects) count until their last sample; a process
// that appears during the scenario counts in full.
type serverCPU struct {
	postmaster int
	mu         sync.Mutex
	first      map[int]int64
	last       map[int]int64
	stop       chan struct{}
	done       chan struct{}
}

func startServerCPU(postmaster int) *serverCPU {
	c := &serverCPU{postmaster: postmaster, first: serverTicks(postmaster), last: map[int]int64{}, stop: make(chan struct{}), done: make(chan struct{})}
	if c.first == nil {
		close(c.done)
		return c
	}
	go func() {
		defer close(c.done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			c.sample()
			select {
			case <-c.stop:
				c.sample()
				return
			case <-t.C:
			}
		}
	}()
	return c
}

func (c *serverCPU) sample() {
	m := serverTicks(c.postmaster)
	c.mu.Lock()
	defer c.mu.Unlock()
	for pid, t := range m {
		c.last[pid] = t
	}
}

// Stop returns the server's CPU seconds since start, or -1 when unknown.
func (c *serverCPU) Stop() float64 {
	if c.first == nil {
		return -1
	}
	close(c.stop)
	<-c.done
	var ticks int64
	for pid, t := range c.last {
		ticks += t - c.first[pid] // a new pid has no first sample: all of it counts
	}
	return float64(ticks) / clockTicks
}

// resetPeakRSS returns freed memory to the OS and resets the kernel's
// resident-set high-water mark (VmHWM) so the next reading is the peak of
// the scenario that follows (Linux: "5" into /proc/self/clear_refs).
func resetPeakRSS() {
	runtime.GC()
	debug.FreeOSMemory()
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// rssMB returns VmHWM and VmRSS of this process in MiB (0 when unknown).
func rssMB() (peak, cur float64) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "VmHWM" && k != "VmRSS") {
			continue
		}
		kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		if k == "VmHWM" {
			peak = kb / 1024
		} else {
			cur = kb / 1024
		}
	}
	return peak, cur
}

// pct returns the p-th percentile of sorted latencies.
func pct(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)) * p / 100)
	return sorted[min(i, len(sorted)-1)]
}

// latencies collects per-goroutine samples without locking and merges them.
type latencies struct {
	per [][]time.Duration
}

func newLatencies(goroutines, hint int) *latencies {
	l := &latencies{per: make([][]time.Duration, goroutines)}
	for i := range l.per {
		l.per[i] = make([]time.Duration, 0, hint)
	}
	return l
}

func (l *latencies) add(g int, d time.Duration) { l.per[g] = append(l.per[g], d) }

func (l *latencies) sorted() []time.Duration {
	var all []time.Duration
	for _, p := range l.per {
		all = append(all, p...)
	}
	slices.Sort(all)
	return all
}
