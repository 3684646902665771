package qp

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/udiwarp/udiwarp/llp"
	"github.com/udiwarp/udiwarp/protect"
)

// deliverEnvelope takes a protection envelope (docs/wire.md §12) that
// reached the device: a Refuse of a contact of ours (either mode), or,
// on a device of today's wire, a Contact or Sealed datagram of a
// protected peer, whose Hello it refuses. (A protected socket's link
// opens Contacts and Sealed datagrams itself: they reach the device as
// plain frames.)
func (d *Device) deliverEnvelope(s *Socket, b []byte, src netip.AddrPort) {
	st := &d.stats
	if _, ok := d.frameOf(b); !ok {
		return
	}
	if b[0] != byte(protect.KindRefuse)<<2 {
		st.ProtModeMismatch.Add(1)
		if _, unicast, ok := s.rxDst(); s.prot == nil && (unicast || !ok) {
			if r := protect.RefuseFor(b, protect.None); r != nil {
				if n, _ := s.ll.Write([]llp.Msg{{Bufs: [][]byte{r}, Addr: src}}); n == 1 {
					st.ProtRefusesSent.Add(1)
				}
			}
		}
		return
	}
	var r protect.Refusal
	if err := r.Parse(b); err != nil {
		st.ProtBadEnvelope.Add(1)
		return
	}
	if q := s.lookupQP(r.FromQP); q != nil && q.rd != nil && q.rd.refused(s, src, &r) {
		st.ProtRefused.Add(1)
		return
	}
	st.ProtUnsolicited.Add(1)
}

// refused ends the contact a Refuse names, if it echoes our Hello.
func (r *rdQP) refused(s *Socket, src netip.AddrPort, ref *protect.Refusal) bool {
	now := time.Now()
	r.lock(s)
	defer r.unlock(now)
	return r.ep.Refused(src, ref.NameQP, ref.Token, &protect.RefusedError{Ours: r.q.dev.cfg.Protect.Mode, Theirs: ref.Mode})
}

// SetPeerKey sets the pre-shared key the device's sockets seal to and
// open from peer with (protect.Link.SetPeerKey): what UD and
// Write-Record to it use when no RD contact gave keys, and what RD
// contacts with it mix in. psk nil removes it. The device must protect
// (DeviceConfig.Protect).
func (d *Device) SetPeerKey(peer netip.AddrPort, psk []byte) error {
	if d.cfg.Protect.Mode == protect.None {
		return fmt.Errorf("%w: a pre-shared key on a device that does not protect (DeviceConfig.Protect)", ErrInvalidAttr)
	}
	if psk != nil && len(psk) < protect.MinPSK {
		return fmt.Errorf("%w: pre-shared key of %d bytes: want %d or more", ErrInvalidAttr, len(psk), protect.MinPSK)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.peerKeys == nil {
		d.peerKeys = map[netip.AddrPort][]byte{}
	}
	if psk == nil {
		delete(d.peerKeys, peer)
	} else {
		d.peerKeys[peer] = append([]byte(nil), psk...)
	}
	for s := range d.sockets {
		if s.prot != nil {
			s.prot.SetPeerKey(peer, psk)
		}
	}
	return nil
}
