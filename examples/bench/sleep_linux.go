package main

import (
	"os"
	"syscall"
	"time"
	"unsafe"
)

// pacer sleeps the open loop's senders until their sends' times, one at a
// time. On Linux it waits on a timerfd in the runtime's poller: the
// kernel's timer wakes it within about 0.1 ms of the time, as nanosleep(2)
// does, and the sleeping goroutine holds no P. A nanosleep is a system call
// that keeps its P while it lasts: at 10,000 sends a second the pacer held
// one of the VM's two Ps most of the time and the side being measured ran
// on the other. time.Sleep holds no P either, but the runtime's poller
// waits in whole milliseconds: it woke 0.6 ms late at the median on an
// idle VM (300 sleeps of up to 10 ms each, side by side with nanosleep).
type pacer struct {
	f  *os.File        // the timerfd; nil: nanosleep
	rc syscall.RawConn // f's
}

// Linux's values (timerfd_create(2)); TFD_NONBLOCK and TFD_CLOEXEC are
// O_NONBLOCK and O_CLOEXEC.
const clockMonotonic = 1

type itimerspec struct{ interval, value syscall.Timespec }

func newPacer() *pacer {
	fd, _, errno := syscall.Syscall(syscall.SYS_TIMERFD_CREATE, clockMonotonic, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return &pacer{}
	}
	// Non-blocking, so os.NewFile puts it in the poller.
	f := os.NewFile(fd, "timerfd")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return &pacer{}
	}
	return &pacer{f: f, rc: rc}
}

// sleepUntil returns at t, at once if t has passed.
func (p *pacer) sleepUntil(t time.Time) {
	d := time.Until(t)
	if d <= 0 {
		return
	}
	if p.f != nil {
		spec := itimerspec{value: syscall.NsecToTimespec(int64(d))}
		var errno syscall.Errno
		if err := p.rc.Control(func(fd uintptr) {
			_, _, errno = syscall.Syscall6(syscall.SYS_TIMERFD_SETTIME, fd, 0, uintptr(unsafe.Pointer(&spec)), 0, 0, 0)
		}); err == nil && errno == 0 {
			var n [8]byte // the count of expirations
			if _, err := p.f.Read(n[:]); err == nil {
				return
			}
		}
	}
	if d = time.Until(t); d > 0 {
		ts := syscall.NsecToTimespec(int64(d))
		_ = syscall.Nanosleep(&ts, nil)
	}
}

func (p *pacer) close() {
	if p.f != nil {
		_ = p.f.Close()
	}
}
