// Package fduse lets system calls use a descriptor directly while another
// goroutine may close it: calls run between Acquire and Release, and
// Retire waits for those in flight before the descriptor is closed. The
// kernel UDP link (llp) and RC's TCP connections (qp) share it.
package fduse

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Use counts the calls using a descriptor.
type Use struct {
	closing atomic.Bool
	users   atomic.Int64
	// Mu orders a descriptor's move (a SetFD) against its close.
	Mu sync.Mutex
}

// Acquire reports whether the descriptor may be used; every true must be
// paired with Release.
func (u *Use) Acquire() bool {
	u.users.Add(1)
	if u.closing.Load() {
		u.users.Add(-1)
		return false
	}
	return true
}

// Release ends a call Acquire allowed.
func (u *Use) Release() { u.users.Add(-1) }

// Closing reports whether Retire was called.
func (u *Use) Closing() bool { return u.closing.Load() }

// Refuse refuses new calls, without waiting for those in flight.
func (u *Use) Refuse() { u.closing.Store(true) }

// Retire refuses new calls and waits for those in flight to end.
func (u *Use) Retire() {
	u.closing.Store(true)
	u.Drain()
}

// Drain waits for the calls in flight to end (after a descriptor moved,
// for those that may still use the old one). Calls are non-blocking: the
// wait is short.
func (u *Use) Drain() {
	for u.users.Load() != 0 {
		runtime.Gosched()
	}
}
