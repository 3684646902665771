package reliability

import (
	"errors"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	ack := &AckBlock{Cumulative: 1<<32 - 3, Delay: 250, Ranges: []Range{{1<<32 - 1, 2}, {5, 7}}, Errors: []AckError{{1<<32 - 5, CodeRemoteAccess}}}
	for _, f := range []Fields{
		{Type: Data, Window: 256, DstQPN: 7, SrcQPN: 9, Epoch: 0xdeadbeef, Token: 0x0102030405060708, Seq: 42},
		{Type: Data, Window: 256, DstQPN: 7, SrcQPN: 9, Epoch: 1, Token: 5, Seq: 43, Init: true, Issued: 77, AckNow: true, Ack: ack},
		{Type: Ack, Window: 64, DstQPN: 1, SrcQPN: 2, Epoch: 3, Token: 4, Ack: ack, RNR: true},
		{Type: Hello, DstQPN: 1, SrcQPN: 2, Epoch: 3, Init: true, Issued: 99},
		{Type: Challenge, DstQPN: 1, SrcQPN: 2, Epoch: 3, Token: 99, Init: true, Issued: 100},
	} {
		b := Append(nil, &f)
		if f.Type == Data {
			b = append(b, "segment"...)
		}
		var h Header
		if err := h.Parse(b); err != nil {
			t.Fatalf("%+v: %v", f, err)
		}
		if h.Type != f.Type || h.Window != f.Window || h.DstQPN != f.DstQPN || h.SrcQPN != f.SrcQPN || h.Epoch != f.Epoch ||
			h.Token != f.Token || h.HasInit != f.Init || h.Issued != f.Issued || h.HasRNR != f.RNR || h.WantsAck != f.AckNow || h.HasAck != (f.Ack != nil) {
			t.Fatalf("parsed %+v from %+v", h, f)
		}
		if f.Type == Data && (h.Seq != f.Seq || string(b[h.Size:]) != "segment") {
			t.Fatalf("data: seq %d, rest %q", h.Seq, b[h.Size:])
		}
		if f.Ack != nil {
			if h.Ack.Cumulative != ack.Cumulative || h.Ack.Delay != ack.Delay || len(h.Ack.Ranges) != 2 || h.Ack.Ranges[0] != ack.Ranges[0] || h.Ack.Ranges[1] != ack.Ranges[1] ||
				len(h.Ack.Errors) != 1 || h.Ack.Errors[0] != ack.Errors[0] {
				t.Fatalf("ack %+v", h.Ack)
			}
		}
	}
}

func TestFrameRejects(t *testing.T) {
	good := Append(nil, &Fields{Type: Ack, Epoch: 1, Token: 2, Ack: &AckBlock{Cumulative: 10, Ranges: []Range{{12, 3}}}})
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for name, tc := range map[string]struct {
		b    []byte
		want error
	}{
		"short":                        {good[:10], ErrShort},
		"UD frame type":                {mut(func(b []byte) []byte { b[0] = b[0]&^3 | 2; return b }), ErrType},
		"unknown type":                 {mut(func(b []byte) []byte { b[0] = 9<<2 | 3; return b }), ErrType},
		"reserved flag":                {mut(func(b []byte) []byte { b[1] |= 0x80; return b }), ErrFlags},
		"ack without block":            {mut(func(b []byte) []byte { b[1] &^= byte(FlagAck); return b[:HeaderSize] }), ErrFlags},
		"epoch 0":                      {mut(func(b []byte) []byte { b[12], b[13], b[14], b[15] = 0, 0, 0, 0; return b }), ErrEpoch},
		"range count 17":               {mut(func(b []byte) []byte { b[HeaderSize+6] = 17; return b }), ErrAckBlock},
		"range count beyond the frame": {mut(func(b []byte) []byte { b[HeaderSize+6] = 2; return b }), ErrShort},
		"empty range":                  {mut(func(b []byte) []byte { b[len(b)-1], b[len(b)-2] = 0, 0; return b }), ErrAckBlock},
		"range touching cumulative":    {mut(func(b []byte) []byte { b[len(b)-3], b[len(b)-4] = 0, 0; return b }), ErrAckBlock},
		"trailing bytes":               {mut(func(b []byte) []byte { return append(b, 0) }), ErrShort},
	} {
		var h Header
		if err := h.Parse(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	var h Header
	if n := testing.AllocsPerRun(100, func() { h.Parse(good) }); n != 0 {
		t.Fatalf("%v allocations per parse", n)
	}
}

func FuzzHeader(f *testing.F) {
	f.Add(Append(nil, &Fields{Type: Data, Epoch: 1, Seq: 5, Init: true, Issued: 3, Ack: &AckBlock{Cumulative: 2, Ranges: []Range{{4, 1}}}}))
	f.Add(Append(nil, &Fields{Type: Challenge, Epoch: 1, Init: true}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h Header
		if h.Parse(b) != nil {
			return
		}
		// Whatever parses re-encodes to the same header bytes.
		fl := Fields{Type: h.Type, Window: h.Window, DstQPN: h.DstQPN, SrcQPN: h.SrcQPN, Epoch: h.Epoch, Token: h.Token,
			Seq: h.Seq, Init: h.HasInit, Issued: h.Issued, RNR: h.HasRNR, AckNow: h.WantsAck}
		if h.HasAck {
			fl.Ack = &h.Ack
		}
		if got := Append(nil, &fl); string(got) != string(b[:h.Size]) {
			t.Fatalf("re-encoded %x, parsed from %x", got, b[:h.Size])
		}
		if len(h.Ack.Ranges) > MaxAckRanges {
			t.Fatal("too many ranges")
		}
	})
}
