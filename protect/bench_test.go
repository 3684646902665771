package protect

import (
	"bytes"
	"testing"

	"github.com/udiwarp/udiwarp/llp"
)

// BenchmarkSealOpen: the cost of protecting one datagram, sealed by one
// link and opened by another, without the network: what a protected
// device adds per datagram beyond the CRC32c it drops.
func BenchmarkSealOpen(b *testing.B) {
	for _, size := range []int{64, 1400, 64000} {
		for _, m := range []Mode{Auth, AEAD} {
			b.Run(m.String()+"/"+itoa(size), func(b *testing.B) {
				x, y, _ := pair(b, m, bytes.Repeat([]byte{7}, 16))
				f := udSend(make([]byte, size))
				msg := &llp.Msg{Bufs: [][]byte{f}, Addr: y.LocalAddr()}
				buf := make([]byte, 0, size+200)
				src := x.LocalAddr()
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					d, err := x.seal(buf, msg)
					if err != nil {
						b.Fatal(err)
					}
					if y.open(d, src, nil, y.coarse) == nil {
						b.Fatal("did not open")
					}
				}
			})
		}
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}
