package qp

import (
	"testing"
)

// BenchmarkPostSend measures the direct send path: header, CRC, sendmsg
// from the registered buffer, unsignaled. It must not allocate.
func BenchmarkPostSend(b *testing.B) {
	for _, size := range []int{64, 1024} {
		b.Run(itoa(size), func(b *testing.B) {
			a := newNode(b, DeviceConfig{}, "udp4", "127.0.0.1:0")
			dst := newNode(b, DeviceConfig{}, "udp4", "127.0.0.1:0") // receives nothing: the datagrams are dropped
			wr := SendWR{SGL: []SGE{a.mr.SGE(0, size)}, AH: a.ah(dst, dst.qp)}
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				if err := a.qp.PostSend(&wr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPoll measures polling a CQ that holds completions, and an
// empty one. Neither may allocate.
func BenchmarkPoll(b *testing.B) {
	d, _ := Open(DeviceConfig{})
	defer d.Close()
	cq, _ := d.CreateCQ(1024)
	wcs := make([]WorkCompletion, 16)
	b.Run("full", func(b *testing.B) {
		b.ReportAllocs()
		wc := WorkCompletion{ID: 1, Len: 64}
		for b.Loop() {
			for range 16 {
				cq.push(&wc)
			}
			if cq.Poll(wcs) != 16 {
				b.Fatal("poll")
			}
		}
	})
	b.Run("empty", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if cq.Poll(wcs) != 0 {
				b.Fatal("poll")
			}
		}
	})
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	s := ""
	for ; n > 0; n /= 10 {
		s = string(rune('0'+n%10)) + s
	}
	return s
}

// BenchmarkReceivePath measures the user-space receive path of one
// datagram: parse, CRC, QP lookup, placement, completion, poll, repost.
func BenchmarkReceivePath(b *testing.B) {
	for _, size := range []int{64, 1024} {
		b.Run(itoa(size), func(b *testing.B) {
			a := newNode(b, DeviceConfig{Poll: PollBusy}, "udp4", "127.0.0.1:0")
			dg := udiwarpSend(a.qp.QPN(), 7, make([]byte, size))
			wr := RecvWR{SGL: []SGE{a.mr.SGE(0, 4096)}}
			a.qp.PostRecv(&wr)
			wcs := make([]WorkCompletion, 1)
			src := a.sock.LocalAddr()
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				a.dev.deliver(a.sock, dg, false, src)
				if a.cq.Poll(wcs) != 1 || wcs[0].Status != Success {
					b.Fatal("no completion")
				}
				a.qp.PostRecv(&wr)
			}
		})
	}
}
