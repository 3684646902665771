package udiwarp

import (
	"testing"
)

var sinkSeg Segment

func benchParse(b *testing.B, seg []byte, p Profile) {
	b.ReportAllocs()
	b.SetBytes(int64(len(seg)))
	for b.Loop() {
		s, err := ParseSegment(seg, p)
		if err != nil {
			b.Fatal(err)
		}
		sinkSeg = s
	}
}

func BenchmarkParse(b *testing.B) {
	dgm, std := seedSegments()
	b.Run("UDSend", func(b *testing.B) { benchParse(b, dgm[0], ProfileDatagram) })
	b.Run("WriteRecord", func(b *testing.B) { benchParse(b, dgm[3], ProfileDatagram) })
	b.Run("ReadRequest", func(b *testing.B) { benchParse(b, std[1], ProfileStream) })
	b.Run("Terminate", func(b *testing.B) { benchParse(b, std[2], ProfileStream) })
	b.Run("AtomicRequest", func(b *testing.B) { benchParse(b, std[3], ProfileStream) })
	b.Run("RDMAWrite", func(b *testing.B) { benchParse(b, std[5], ProfileStream) })
	for _, n := range []int{64, 1400, 64000} {
		frame := SealDatagram(dgmWriteRecord(WriteRecordFields{Last: true, STag: 0x101, TO: 0, MSN: 1, MessageLength: uint32(n), DstQPN: 1, SrcQPN: 2}, make([]byte, n)), 0)
		b.Run("UDFrameWithCRC/"+itoa(uint64(n)), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(frame)))
			for b.Loop() {
				s, err := ParseUDFrame(frame)
				if err != nil {
					b.Fatal(err)
				}
				sinkSeg = s
			}
		})
	}
}

func BenchmarkBuild(b *testing.B) {
	buf := make([]byte, 0, 256)
	b.Run("Tagged", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(DDPTaggedHeaderSize)
		f := TaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpWrite), STag: 1, TO: 2}
		for b.Loop() {
			buf = AppendTagged(buf[:0], &f)
		}
	})
	b.Run("WriteRecord", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(WriteRecordHeaderSize)
		f := WriteRecordFields{RDMAP: NewRDMAPControl(OpWrite), STag: 1, TO: 2, MSN: 3, MO: 0, MessageLength: 9, DstQPN: 1, SrcQPN: 2}
		for b.Loop() {
			buf = AppendWriteRecord(buf[:0], &f)
		}
	})
	b.Run("Untagged", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(DDPUntaggedHeaderSize)
		f := UntaggedFields{Last: true, DV: 2, RDMAP: NewRDMAPControl(OpSend), ULP: 2, QN: DatagramQN(1, QueueSend), MSN: 1}
		for b.Loop() {
			buf = AppendUntagged(buf[:0], &f)
		}
	})
	b.Run("ReadRequest", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(DDPUntaggedHeaderSize + ReadRequestSize)
		u := UntaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpReadRequest), QN: 1, MSN: 1}
		r := ReadRequestFields{SinkSTag: 1, Size: 4096, SourceSTag: 2}
		for b.Loop() {
			buf = AppendReadRequest(AppendUntagged(buf[:0], &u), &r)
		}
	})
	b.Run("Terminate", func(b *testing.B) {
		hdr := AppendTagged(nil, &TaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpWrite)})
		f := TerminateFields{Code: DDPTaggedBaseBounds, SegmentLengthValid: true, DDPSegmentLength: 100, DDPHeader: hdr}
		u := UntaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpTerminate), QN: 2, MSN: 1}
		b.ReportAllocs()
		b.SetBytes(int64(DDPUntaggedHeaderSize + TerminateSize(&f)))
		for b.Loop() {
			buf, _ = AppendTerminate(AppendUntagged(buf[:0], &u), &f)
		}
	})
	b.Run("AtomicRequest", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(DDPUntaggedHeaderSize + AtomicRequestSize)
		u := UntaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpAtomicRequest), QN: 1, MSN: 1}
		a := AtomicRequestFields{Op: AtomicCmpSwap, STag: 1, TO: 8}
		for b.Loop() {
			buf = AppendAtomicRequest(AppendUntagged(buf[:0], &u), &a)
		}
	})
	b.Run("MPARequest", func(b *testing.B) {
		b.ReportAllocs()
		f := MPAFrameFields{Revision: 2, Enhanced: true, CRC: true, IRDORD: IRDORD{IRD: 16, ORD: 16}}
		b.SetBytes(MPAFrameHeaderSize + 4)
		for b.Loop() {
			buf, _ = AppendMPAFrame(buf[:0], &f)
		}
	})
}

func BenchmarkMPA(b *testing.B) {
	payload := make([]byte, 1400)
	hdr := AppendUntagged(nil, &UntaggedFields{Last: true, DV: 1, RDMAP: NewRDMAPControl(OpSend), MSN: 1})
	for _, markers := range []bool{false, true} {
		name := "plain"
		if markers {
			name = "markers"
		}
		b.Run("Frame/"+name+"/1400", func(b *testing.B) {
			f := MPAFramer{Markers: markers, CRC: true}
			out := make([]byte, 0, 4096)
			b.ReportAllocs()
			b.SetBytes(int64(len(hdr) + len(payload)))
			for b.Loop() {
				out, _ = f.Append(out[:0], hdr, payload)
			}
		})
		b.Run("Deframe/"+name+"/1400", func(b *testing.B) {
			// A long stream so marker positions vary from FPDU to FPDU.
			f := MPAFramer{Markers: markers, CRC: true}
			var stream []byte
			const k = 64
			for range k {
				stream, _ = f.Append(stream, hdr, payload)
			}
			work := make([]byte, len(stream))
			b.ReportAllocs()
			b.SetBytes(int64(len(hdr) + len(payload)))
			var d MPADeframer
			rest := work[:0]
			for b.Loop() {
				if len(rest) == 0 {
					copy(work, stream)
					rest = work
					d = MPADeframer{Markers: markers, CRC: true}
				}
				_, n, _, err := d.Next(rest)
				if err != nil || n == 0 {
					b.Fatal(err)
				}
				rest = rest[n:]
			}
		})
	}
}
