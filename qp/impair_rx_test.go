package qp

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"
)

// rxImpaired sends n numbered UD Sends of size bytes from a plain device
// to one whose sockets read through im (DeviceConfig.ImpairRx), paced
// within the socket buffer, and returns the numbers the receiver
// completed, in order, once the device has handled all n datagrams
// (counted received or impaired) and the link holds none back.
func rxImpaired(t *testing.T, im *Impairment, n, size int, settle func(got int) bool) (nums []uint32, rx *node) {
	t.Helper()
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{ImpairRx: im}, "udp4", "127.0.0.1:0")
	for i := range 2 * n {
		if err := b.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*size, size)}}); err != nil {
			t.Fatal(err)
		}
	}
	ah := a.ah(b, b.qp)
	for i := range n {
		msg := a.buf[i*size : (i+1)*size]
		fill(msg, i)
		binary.BigEndian.PutUint32(msg, uint32(i))
		if err := a.qp.PostSend(&SendWR{ID: uint64(i), SGL: []SGE{a.mr.SGE(i*size, size)}, AH: ah}); err != nil {
			t.Fatal(err)
		}
		if i%32 == 31 { // within the socket buffer however slow the receiver
			eventually(t, "the receiver reads the burst", func() bool { return handled(b, im) >= uint64(i+1) })
		}
	}
	eventually(t, "the receiver reads every datagram", func() bool { return handled(b, im) >= uint64(n) })
	wcs := make([]WorkCompletion, 2*n)
	got := 0
	eventually(t, "the link delivers what it holds", func() bool {
		got += b.cq.Poll(wcs[got:])
		return settle(got)
	})
	for _, wc := range wcs[:got] {
		if wc.Status != Success || int(wc.Len) != size {
			t.Fatalf("completion %+v", wc)
		}
		msg := b.buf[int(wc.ID)*size : int(wc.ID)*size+size]
		i := binary.BigEndian.Uint32(msg)
		want := make([]byte, size)
		fill(want, int(i))
		binary.BigEndian.PutUint32(want, i)
		if string(msg) != string(want) {
			t.Fatalf("message %d arrived changed", i)
		}
		nums = append(nums, i)
	}
	return nums, b
}

// handled is how many datagrams n's device has read: those its stack saw
// (RxDatagrams, after the receive impairment) and those im dropped.
func handled(n *node, im *Impairment) uint64 {
	return n.dev.Stats().RxDatagrams.Load() + im.Dropped.Load()
}

// TestImpairRx: the receive direction of the impairment layer drops,
// duplicates, reorders, delays and corrupts what a device's sockets read,
// as drawn from its seed, before the stack sees it; every datagram that
// passes is delivered as read.
func TestImpairRx(t *testing.T) {
	const n, size = 128, 200
	t.Run("loss", func(t *testing.T) {
		im := &Impairment{Seed: 3, Loss: 0.25}
		nums, b := rxImpaired(t, im, n, size, func(got int) bool { return got > 0 && uint64(got)+im.Dropped.Load() == n })
		if d := im.Dropped.Load(); d == 0 || d == n || len(nums) != n-int(d) {
			t.Fatalf("dropped %d, delivered %d of %d", d, len(nums), n)
		}
		if b.dev.Stats().RxImpaired.Load() != im.Dropped.Load() {
			t.Fatalf("RxImpaired %d, dropped %d", b.dev.Stats().RxImpaired.Load(), im.Dropped.Load())
		}
		for k := 1; k < len(nums); k++ {
			if nums[k] <= nums[k-1] {
				t.Fatalf("loss alone reordered: %v", nums)
			}
		}
	})
	t.Run("duplicate", func(t *testing.T) {
		im := &Impairment{Seed: 3, Duplicate: 1}
		nums, _ := rxImpaired(t, im, n, size, func(got int) bool { return got == 2*n })
		for k, i := range nums {
			if int(i) != k/2 {
				t.Fatalf("delivery %d is message %d, want every message twice in order", k, i)
			}
		}
	})
	t.Run("reorder", func(t *testing.T) {
		im := &Impairment{Seed: 3, Reorder: 1} // every other one held behind the next
		nums, _ := rxImpaired(t, im, n, size, func(got int) bool { return got == n })
		for k, i := range nums {
			if want := k ^ 1; int(i) != want {
				t.Fatalf("delivery %d is message %d, want %d (pairs swapped): %v", k, i, want, nums)
			}
		}
	})
	t.Run("delay", func(t *testing.T) {
		im := &Impairment{Seed: 3, Delay: 20 * time.Millisecond, Jitter: 5 * time.Millisecond}
		nums, _ := rxImpaired(t, im, n, size, func(got int) bool { return got == n })
		if len(nums) != n || im.Delayed.Load() != n {
			t.Fatalf("delivered %d, delayed %d, of %d", len(nums), im.Delayed.Load(), n)
		}
	})
	t.Run("corrupt", func(t *testing.T) {
		im := &Impairment{Seed: 3, Corrupt: 1}
		nums, b := rxImpaired(t, im, n, size, func(got int) bool { return true })
		st := b.dev.Stats()
		if len(nums) != 0 || im.Corrupted.Load() != n {
			t.Fatalf("%d delivered, %d corrupted, of %d", len(nums), im.Corrupted.Load(), n)
		}
		if bad := st.RxBadCRC.Load() + st.RxBadHeader.Load() + st.RxBadVersion.Load() + st.RxUnknownQP.Load() + st.RxBadOpcode.Load(); bad != n {
			t.Fatalf("%d corrupted datagrams refused, want %d", bad, n)
		}
	})
}

// TestImpairBothWays: one device impairs in both directions with two
// Impairments; the same Impairment for both is refused.
func TestImpairBothWays(t *testing.T) {
	im := &Impairment{Seed: 1, Loss: 0.1}
	if _, err := Open(DeviceConfig{Impair: im, ImpairRx: im}); !errors.Is(err, ErrInvalidAttr) {
		t.Fatalf("one Impairment for both directions: %v, want ErrInvalidAttr", err)
	}
	tx, rx := &Impairment{Seed: 1, Loss: 0.2}, &Impairment{Seed: 2, Loss: 0.2}
	a := newNode(t, DeviceConfig{Impair: tx, ImpairRx: rx}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	const n, size = 128, 100
	for i := range n {
		mustPost(t, a.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{a.mr.SGE(i*size, size)}}))
		mustPost(t, b.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*size, size)}}))
	}
	toB, toA := a.ah(b, b.qp), b.ah(a, a.qp)
	// Sent from past the receives: a send read from a posted receive's
	// bytes races with the datagram the stack places there.
	for i := range n {
		mustPost(t, a.qp.PostSend(&SendWR{SGL: []SGE{a.mr.SGE(n*size, size)}, AH: toB}))
		mustPost(t, b.qp.PostSend(&SendWR{SGL: []SGE{b.mr.SGE(n*size, size)}, AH: toA}))
		if i%32 == 31 {
			eventually(t, "both read the burst", func() bool {
				return handled(a, rx) >= uint64(i+1) && handled(b, tx) >= uint64(i+1)
			})
		}
	}
	eventually(t, "every datagram is handled", func() bool {
		return handled(a, rx) == n && handled(b, tx) == n
	})
	if tx.Dropped.Load() == 0 || rx.Dropped.Load() == 0 {
		t.Fatalf("dropped on the way out %d, on the way in %d: want both", tx.Dropped.Load(), rx.Dropped.Load())
	}
	wcs := make([]WorkCompletion, 2*n)
	var got [2]int
	eventually(t, "the completions", func() bool {
		got[0] += a.cq.Poll(wcs)
		got[1] += b.cq.Poll(wcs)
		// a's CQ holds its receives; b's its receives (sends are unsignaled).
		return got[0] == n-int(rx.Dropped.Load()) && got[1] == n-int(tx.Dropped.Load())
	})
}

// TestImpairRxLands: the receive impairment wraps the lower layer, so
// what passes it is read into the buffers the receive side supplies and
// lands in posted receives as on a clean link, duplicates included (it
// used to turn landing off, and the stack under it ran another path).
func TestImpairRxLands(t *testing.T) {
	const n, size = 64, 4096 // large enough to land (landBigMin)
	im := &Impairment{Seed: 5, Duplicate: 0.2}
	nums, b := rxImpaired(t, im, n, size, func(got int) bool { return got == n+int(im.Duplicated.Load()) })
	seen := map[uint32]int{}
	for _, i := range nums {
		seen[i]++
	}
	if len(seen) != n || im.Duplicated.Load() == 0 {
		t.Fatalf("%d distinct of %d, %d duplicated", len(seen), n, im.Duplicated.Load())
	}
	if l := b.dev.Stats().RxLanded.Load(); l == 0 {
		t.Fatal("nothing landed in place behind the receive impairment")
	}
}

// TestImpairRxSocketsOfOneDevice: one device's generator serves all its
// sockets; a datagram one socket's reader holds back (reordering) and
// another's lets out is delivered by its own socket, under that socket's
// receive lock (run with -race), never lost or given to the wrong QP.
func TestImpairRxSocketsOfOneDevice(t *testing.T) {
	im := &Impairment{Seed: 9, Reorder: 0.5}
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{ImpairRx: im}, "udp4", "127.0.0.1:0")
	s2, err := b.dev.Bind("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	q2, err := b.pd.CreateQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.cq, Caps: QPCaps{MaxSendWR: 64, MaxRecvWR: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []ModifyAttr{{State: StateInit, Socket: s2}, {State: StateRTR}, {State: StateRTS}} {
		if err := q2.Modify(st); err != nil {
			t.Fatal(err)
		}
	}
	const n, size = 256, 64
	for i := range n {
		mustPost(t, b.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*size, size)}}))
		mustPost(t, q2.PostRecv(&RecvWR{ID: uint64(n + i), SGL: []SGE{b.mr.SGE((n+i)*size, size)}}))
	}
	to1 := a.ah(b, b.qp)
	to2, err := a.pd.CreateAH(s2.LocalAddr(), q2.num)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		mustPost(t, a.qp.PostSend(&SendWR{Inline: []byte{byte(i), byte(i >> 8), 1}, AH: to1}))
		mustPost(t, a.qp.PostSend(&SendWR{Inline: []byte{byte(i), byte(i >> 8), 2}, AH: to2}))
		if i%16 == 15 {
			eventually(t, "the receiver reads the burst", func() bool { return handled(b, im) >= uint64(2*(i+1)-1) })
		}
	}
	wcs := make([]WorkCompletion, 2*n)
	got := 0
	// Reordering holds at most one datagram back, behind the next one.
	eventually(t, "every datagram but the one held", func() bool {
		got += b.cq.Poll(wcs[got:])
		return got >= 2*n-1
	})
	for _, wc := range wcs[:got] {
		if wc.Status != Success || wc.Len != 3 {
			t.Fatalf("completion %+v", wc)
		}
		msg := b.buf[int(wc.ID)*size : int(wc.ID)*size+3]
		want := byte(1)
		if wc.QPN == q2.num {
			want = 2
		}
		if msg[2] != want || (wc.ID >= n) != (want == 2) {
			t.Fatalf("receive %d on QP %d holds a datagram for the other socket: %v", wc.ID, wc.QPN, msg)
		}
	}
	if im.Reordered.Load() == 0 {
		t.Fatal("nothing reordered")
	}
}

// TestImpairTxCoversReplies: the send impairment wraps the lower layer,
// so the datagrams the stack answers with itself (a Terminate for a Send
// with no receive posted) pass it too; they used to leave around it.
func TestImpairTxCoversReplies(t *testing.T) {
	im := &Impairment{Seed: 1, Loss: 1}
	a := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	b := newNode(t, DeviceConfig{Impair: im}, "udp4", "127.0.0.1:0")
	q := b.newQP(QPAttr{Type: UD, SendCQ: b.cq, RecvCQ: b.cq, ReportErrors: true, Caps: QPCaps{MaxSendWR: 4, MaxRecvWR: 4}})
	if err := a.qp.PostSend(&SendWR{SGL: []SGE{a.mr.SGE(0, 100)}, AH: a.ah(b, q)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b answers into its impairment", func() bool { return b.dev.Stats().TxImpaired.Load() == 1 })
	if im.Dropped.Load() != 1 || b.dev.Stats().RxNoRecv.Load() != 1 {
		t.Fatalf("dropped %d, no-receive %d", im.Dropped.Load(), b.dev.Stats().RxNoRecv.Load())
	}
	if a.dev.Stats().RxRemoteErrors.Load() != 0 {
		t.Fatal("the Terminate went around the impairment")
	}
}
