package qp

import "github.com/udiwarp/udiwarp/udiwarp"

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
// hole limit: it reports whether p's receiver may buffer frame seg, seq
// ahead of its gap. A Send that would make p's claims pass OutOfOrder,
// or a frame that would make its held frames span more gaps than Holes,
// makes p drop everything it holds ahead of its gap, and goes with it:
// out-of-order frames go first, before anything in order is refused, and
// a gap filled later finds its receive. Caller holds r.mu.
func (r *rdQP) admitOutOfOrder(p *rdPeer, seq uint32, seg []byte) bool {
	a := r.q.srqa
	if lim := int(a.holes.Load()); lim > 0 && p.rcv.HolesWith(seq) > lim {
		r.dropOutOfOrder(p)
		return false
	}
	if lim := int(a.ooo.Load()); lim > 0 && p.rcv.Claims() >= lim && rdNeedsRecv(seg) {
		r.dropOutOfOrder(p)
		return false
	}
	return true
}

// dropOutOfOrder makes p's receiver let go of every frame it holds ahead
// of its gap, and counts them with the frame that drew it. None was
// acknowledged, so p's sender sends them again and nothing completes at
// the sender that was not delivered (reliability.Receiver.Renege). Caller
// holds r.mu.
func (r *rdQP) dropOutOfOrder(p *rdPeer) {
	q := r.q
	n := uint64(p.rcv.Renege() + 1) // its release takes each off the byte budgets
	q.dev.stats.RxSRQOutOfOrder.Add(n)
	q.srqa.oooDropped.Add(n)
	q.dev.raise(AsyncEvent{Type: AsyncSRQOutOfOrder, QP: q, SRQ: q.srq, Source: p.key.addr})
}
