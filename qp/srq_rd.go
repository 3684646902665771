package qp

import (
	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
)

// The out-of-order side of seed 004 on an RD QP, whose peers are the
// seed's connections. A Send (or Immediate Data) a peer's receiver holds
// ahead of a gap until the gap fills is a claim on a receive of the SRQ,
// which it takes once in order: the seed's out-of-order WQE. RD keeps its
// copy on the heap, not in a posted receive, so no receive is taken yet
// and none shows in a CQ; the receiver counts the claims
// (reliability.Receiver.Claim), the scoreboard shows them
// (SRQScore.OutOfOrder), and the QP's SRQLimits bound them.

// rdNeedsRecv reports whether a DDP segment RD holds takes a receive once
// delivered: a Send or an Immediate Data message.
func rdNeedsRecv(b []byte) bool {
	op, ok := rdUntaggedOp(b)
	return ok && (isSend(op) || op == udiwarp.OpImmediateData || op == udiwarp.OpImmediateDataSE)
}

// rdUntaggedOp reads the opcode of a DDP segment RD delivered (its
// checks done), and whether it is untagged, without parsing it again.
func rdUntaggedOp(b []byte) (udiwarp.Opcode, bool) {
	if len(b) < 2 || udiwarp.DDPControl(b[0]).Tagged() {
		return 0, false
	}
	return udiwarp.RDMAPControl(b[1]).Opcode(), true
}

// admitOutOfOrder is the one home of the out-of-order threshold and the
// hole limit: it says whether p's receiver may buffer frame seg ahead of
// its gap, given what it holds (hs). A Send that would make p's claims
// pass OutOfOrder, or a frame that would make its held frames span more
// gaps than Holes, makes p drop everything it holds ahead of its gap, and
// goes with it (HoldRenege): out-of-order frames go first, before
// anything in order is refused, and a gap filled later finds its receive.
// None was acknowledged, so p's sender sends them again and nothing
// completes at the sender that was not delivered
// (reliability.Receiver.Renege). Caller holds r.mu.
func (r *rdQP) admitOutOfOrder(p *rdPeer, hs reliability.HoldState, seg []byte) reliability.HoldVerdict {
	q := r.q
	a := q.srqa
	holes := int(a.holes.Load())
	ooo := int(a.ooo.Load())
	if holes > 0 && hs.HolesWith > holes || ooo > 0 && hs.Claims >= ooo && rdNeedsRecv(seg) {
		n := uint64(hs.Held + 1)
		q.dev.stats.RxSRQOutOfOrder.Add(n)
		a.oooDropped.Add(n)
		q.dev.raise(AsyncEvent{Type: AsyncSRQOutOfOrder, QP: q, SRQ: q.srq, Source: p.key.addr})
		return reliability.HoldRenege
	}
	return reliability.HoldKeep
}
