package protect

import (
	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
)

// RefuseFor is the Refuse a device running mode answers datagram b with
// (a whole datagram, CRC trailer included), or nil: b must be an RD Hello
// — in clear, or in a Contact envelope — of a mode other than ours, with
// its CRC right, and no smaller than the Refuse. It is the one home of
// that rule, for a protected link and for a device of today's wire (which
// refuses Contacts). The caller answers only a unicast datagram.
func RefuseFor(b []byte, mode Mode) []byte {
	if len(b) < RefuseSize {
		return nil
	}
	f, err := udiwarp.OpenDatagram(b)
	if err != nil {
		return nil
	}
	if b[0]&3 == 0 {
		var h Header
		if h.Parse(b) != nil || h.Kind != KindContact || h.Mode == mode {
			return nil
		}
		f = f[h.Size:]
	} else if mode == None {
		return nil // a clear Hello at a device of today's wire is its own
	}
	var rh reliability.Header
	if rh.Parse(f) != nil || rh.Type != reliability.Hello || rh.SrcQPN == 0 {
		return nil
	}
	r := AppendRefuse(make([]byte, 0, RefuseSize), &Refusal{Mode: mode, FromQP: rh.SrcQPN, NameQP: rh.DstQPN, Token: rh.Issued})
	return udiwarp.SealDatagram(r, 0)
}
