package qp

// ring is a fixed-capacity FIFO: the storage of send and receive queues,
// SRQs and CQs. It does no locking; its owner does.
type ring[T any] struct {
	buf  []T
	head int
	n    int
}

func newRing[T any](capacity int) ring[T] { return ring[T]{buf: make([]T, capacity)} }

func (r *ring[T]) len() int   { return r.n }
func (r *ring[T]) cap() int   { return len(r.buf) }
func (r *ring[T]) full() bool { return r.n == len(r.buf) }

// at returns the i-th entry from the front; i == len() is the slot the
// next push fills.
func (r *ring[T]) at(i int) *T {
	j := r.head + i
	if j >= len(r.buf) {
		j -= len(r.buf)
	}
	return &r.buf[j]
}

// push claims the slot at the back; the caller checked full and fills it.
func (r *ring[T]) push() *T {
	p := r.at(r.n)
	r.n++
	return p
}

func (r *ring[T]) front() *T { return &r.buf[r.head] }

// pop drops the front entry (its storage stays, for slots that own buffers).
func (r *ring[T]) pop() {
	r.head++
	if r.head == len(r.buf) {
		r.head = 0
	}
	r.n--
}

func (r *ring[T]) reset() { r.head, r.n = 0, 0 }
