package udiwarp

import (
	"fmt"
	"strings"
)

// String describes the segment's fields in one line, for logs and the
// udperf decoder.
func (s Segment) String() string {
	var b strings.Builder
	op := s.Opcode()
	fmt.Fprintf(&b, "%s DV=%d", op, s.Control.Version())
	if s.Control.Last() {
		b.WriteString(" L")
	}
	switch {
	case s.Control.Tagged() && len(s.Header) == WriteRecordHeaderSize && s.Control.WriteRecord():
		h := s.WriteRecord()
		fmt.Fprintf(&b, " Write-Record STag=%#08x TO=%#x MSN=%d MO=%d MsgLen=%d dstQP=%d srcQP=%d",
			h.Tagged().STag(), h.Tagged().TO(), h.MSN(), h.MO(), h.MessageLength(), h.DstQPN(), h.SrcQPN())
	case s.Control.Tagged():
		h := s.Tagged()
		fmt.Fprintf(&b, " STag=%#08x TO=%#x", h.STag(), h.TO())
	default:
		h := s.Untagged()
		if s.Profile == ProfileDatagram {
			fmt.Fprintf(&b, " dstQP=%d queue=%s srcQP=%d", h.DstQPN(), Queue(h.Queue()), h.SrcQPN())
		} else {
			fmt.Fprintf(&b, " QN=%d", h.QN())
			if op.Invalidates() {
				fmt.Fprintf(&b, " InvSTag=%#08x", h.ULP())
			}
		}
		fmt.Fprintf(&b, " MSN=%d MO=%d", h.MSN(), h.MO())
		switch op {
		case OpReadRequest:
			r := s.ReadRequest()
			fmt.Fprintf(&b, " sink=%#08x@%#x size=%d source=%#08x@%#x", r.SinkSTag(), r.SinkTO(), r.Size(), r.SourceSTag(), r.SourceTO())
		case OpTerminate:
			t := s.Terminate()
			fmt.Fprintf(&b, " [%s] M=%t D=%t R=%t", t.Code(), t.M(), t.D(), t.R())
		case OpAtomicRequest:
			a := s.AtomicRequest()
			fmt.Fprintf(&b, " %s id=%d STag=%#08x TO=%#x", a.Op(), a.RequestID(), a.STag(), a.TO())
		case OpAtomicResponse:
			a := s.AtomicResponse()
			fmt.Fprintf(&b, " id=%d value=%#x", a.RequestID(), a.Value())
		case OpImmediateData, OpImmediateDataSE:
			fmt.Fprintf(&b, " data=%#016x", s.ImmediateData().Value())
		}
	}
	fmt.Fprintf(&b, " payload=%d", len(s.Payload))
	return b.String()
}
