package crc32c

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"testing"

	kcrc "github.com/klauspost/crc32"
)

func want(p []byte) uint32 { return crc32.Checksum(p, table) }

// withFold runs f once with the folding kernel as the CPU allows and, on
// a CPU that has it, once more with it off, so both paths are tested.
func withFold(t *testing.T, f func(t *testing.T)) {
	t.Run("kernel="+Kernel(), f)
	if useArch {
		useArch = false
		defer func() { useArch = true }()
		t.Run("kernel=hash/crc32", f)
	}
}

// RFC 3720 Appendix B.4.
func TestRFC3720Vectors(t *testing.T) {
	inc, dec, ff := make([]byte, 32), make([]byte, 32), bytes.Repeat([]byte{0xff}, 32)
	for i := range inc {
		inc[i], dec[i] = byte(i), byte(31-i)
	}
	read := []byte{
		0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
		0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
		0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
	}
	for _, v := range []struct {
		name string
		p    []byte
		crc  uint32
	}{
		{"32 zeros", make([]byte, 32), 0x8a9136aa},
		{"32 ones", ff, 0x62a8ab43},
		{"incrementing", inc, 0x46dd794e},
		{"decrementing", dec, 0x113fdb5c},
		{"iSCSI read", read, 0xd9963a56},
	} {
		if got := Checksum(v.p); got != v.crc {
			t.Errorf("%s: %#08x, RFC 3720 says %#08x", v.name, got, v.crc)
		}
	}
}

// The vectors' patterns at lengths the kernel takes, against hash/crc32.
func TestLargeVectors(t *testing.T) {
	withFold(t, func(t *testing.T) {
		for _, n := range []int{128, 256, 1500, 4096, 9000, 65536, 1 << 20} {
			for _, fill := range []func(i int) byte{
				func(int) byte { return 0 }, func(int) byte { return 0xff },
				func(i int) byte { return byte(i) }, func(i int) byte { return byte(-1 - i) },
			} {
				p := make([]byte, n)
				for i := range p {
					p[i] = fill(i)
				}
				if got, w := Checksum(p), want(p); got != w {
					t.Fatalf("len %d: %#08x, hash/crc32 %#08x", n, got, w)
				}
			}
		}
	})
}

// Every length to 4 KiB at every alignment in a cache line, from several
// initial CRCs: this crosses every boundary of the kernel (128 bytes,
// each 32, the crossover, the tail handed to hash/crc32).
func TestEveryLengthAndAlignment(t *testing.T) {
	buf := make([]byte, 4096+64)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	withFold(t, func(t *testing.T) {
		for n := 0; n <= 4096; n++ {
			for off := 0; off < 64; off++ {
				p := buf[off : off+n]
				for _, init := range []uint32{0, 0xffffffff, rng.Uint32()} {
					if got, w := Update(init, p), crc32.Update(init, table, p); got != w {
						t.Fatalf("len %d offset %d init %#x: %#08x, hash/crc32 %#08x", n, off, init, got, w)
					}
				}
			}
		}
	})
}

// Around the crossover and the kernel's steps, exactly.
func TestBoundaries(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	withFold(t, func(t *testing.T) {
		for _, b := range []int{32, 128, 160, 256, 288, foldMin, 1 << 16, 1 << 17} {
			for d := -33; d <= 33; d++ {
				n := b + d
				if n < 0 {
					continue
				}
				p := make([]byte, n)
				for i := range p {
					p[i] = byte(rng.Uint32())
				}
				if got, w := Checksum(p), want(p); got != w {
					t.Fatalf("len %d: %#08x, hash/crc32 %#08x", n, got, w)
				}
			}
		}
	})
}

// The CRC of a+b from the CRC of a, at every split of buffers that cross
// the crossover.
func TestIncremental(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	p := make([]byte, 3000)
	for i := range p {
		p[i] = byte(rng.Uint32())
	}
	whole := want(p)
	withFold(t, func(t *testing.T) {
		for split := 0; split <= len(p); split++ {
			if got := Update(Checksum(p[:split]), p[split:]); got != whole {
				t.Fatalf("split at %d: %#08x, whole %#08x", split, got, whole)
			}
		}
		// Many pieces, as a frame's header, payload and pad are summed.
		crc := uint32(0)
		for rest := p; len(rest) > 0; {
			k := min(len(rest), 1+rng.IntN(700))
			crc = Update(crc, rest[:k])
			rest = rest[k:]
		}
		if crc != whole {
			t.Fatalf("in random pieces: %#08x, whole %#08x", crc, whole)
		}
	})
}

// The constants as the method derives them, against the reflected
// values libraries publish for Castagnoli (x^(e-1) mod P, bit-reversed):
// x^127 mod P (e = 128, the fold by 64 bits' high multiplier) and the
// 33-bit identity x^32 mod P = P's low bits.
func TestConstants(t *testing.T) {
	if xPowModP(32) != poly {
		t.Fatalf("x^32 mod P = %#x, want the polynomial's low bits %#x", xPowModP(32), poly)
	}
	if got := xPowModP(31); got != 1<<31 {
		t.Fatalf("x^31 mod P = %#x", got)
	}
	// x^(a+b) = x^a · x^b mod P, checked through a carry-less product.
	for _, ab := range [][2]int{{100, 200}, {1087, 63}, {511, 513}} {
		if got, w := mulModP(xPowModP(ab[0]), xPowModP(ab[1])), xPowModP(ab[0]+ab[1]); got != w {
			t.Fatalf("x^%d·x^%d mod P = %#x, x^%d mod P = %#x", ab[0], ab[1], got, ab[0]+ab[1], w)
		}
	}
}

func mulModP(a, b uint32) uint32 {
	var r uint64
	for i := 0; i < 32; i++ {
		if b&(1<<i) != 0 {
			r ^= uint64(a) << i
		}
	}
	for i := 63; i >= 32; i-- {
		if r&(1<<i) != 0 {
			r ^= (1<<32 | poly) << (i - 32)
		}
	}
	return uint32(r)
}

func FuzzUpdate(f *testing.F) {
	f.Add([]byte("123456789"), uint32(0), uint16(4), uint8(0))
	f.Add(bytes.Repeat([]byte{0xa5}, 700), uint32(0xdeadbeef), uint16(300), uint8(7))
	f.Fuzz(func(t *testing.T, p []byte, init uint32, split uint16, off uint8) {
		// Realign p by copying it at an offset.
		buf := make([]byte, len(p)+int(off%64))
		q := buf[off%64:]
		copy(q, p)
		w := crc32.Update(init, table, q)
		if got := Update(init, q); got != w {
			t.Fatalf("len %d offset %d: %#08x, hash/crc32 %#08x", len(q), off%64, got, w)
		}
		s := int(split) % (len(q) + 1)
		if got := Update(Update(init, q[:s]), q[s:]); got != w {
			t.Fatalf("len %d split %d: %#08x, whole %#08x", len(q), s, got, w)
		}
	})
}

var sizes = []int{16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 1500, 2048, 4096, 9000, 16384, 65536}

// BenchmarkCRC32c compares this package with hash/crc32 and
// klauspost/crc32 at each size: the crossover table in BENCHMARKS.md.
func BenchmarkCRC32c(b *testing.B) {
	ktab := kcrc.MakeTable(kcrc.Castagnoli)
	for _, n := range sizes {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(i * 7)
		}
		for _, impl := range []struct {
			name string
			f    func([]byte) uint32
		}{
			{"crc32c", Checksum},
			{"hash-crc32", func(p []byte) uint32 { return crc32.Checksum(p, table) }},
			{"klauspost", func(p []byte) uint32 { return kcrc.Checksum(p, ktab) }},
		} {
			b.Run(fmt.Sprintf("size=%d/impl=%s", n, impl.name), func(b *testing.B) {
				b.SetBytes(int64(n))
				for b.Loop() {
					impl.f(p)
				}
			})
		}
	}
}

// BenchmarkFold is the kernel alone at every multiple of 32 near the
// crossover, to place it.
func BenchmarkFold(b *testing.B) {
	if !useArch {
		b.Skip("no folding kernel on this CPU")
	}
	fold := func(crc uint32, p []byte) uint32 { return archUpdate(crc, p) }
	for n := 128; n <= 1024; n += 32 {
		p := make([]byte, n)
		b.Run(fmt.Sprintf("size=%d/impl=fold", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				fold(0, p)
			}
		})
		b.Run(fmt.Sprintf("size=%d/impl=hash-crc32", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				crc32.Update(0, table, p)
			}
		})
	}
}
