package qp

import (
	"fmt"
	"time"

	"github.com/udiwarp/udiwarp/reliability"
)

// rdAccounting checks the RD QP's books against its peers: the bytes
// held ahead of gaps are the peers' sum, none negative, within the
// budgets; every WR not completed is a peer's; and the engine's peer
// table keeps its invariants (reliability.Endpoint.Check). The caller
// holds r.mu.
func rdAccounting(r *rdQP) error {
	held, posted := 0, 0
	var err error
	r.ep.EachPeer(func(pi *reliability.PeerInfo) {
		if pi.HeldBytes < 0 || pi.HeldBytes > r.cfg.MaxHeldBytes {
			err = fmt.Errorf("RD peer %v holds %d bytes, budget %d", pi.Key, pi.HeldBytes, r.cfg.MaxHeldBytes)
		}
		held += pi.HeldBytes
		posted += pi.Outstanding
	})
	if err != nil {
		return err
	}
	// Every WR not completed is its peer's, and its peer is in the table
	// (rdFlush relies on it).
	if posted != r.nout {
		return fmt.Errorf("RD QP: %d WRs not completed, its peers hold %d", r.nout, posted)
	}
	if held != r.ep.Held() || held > r.cfg.MaxQPHeldBytes {
		return fmt.Errorf("RD QP holds %d bytes, its peers %d, budget %d", r.ep.Held(), held, r.cfg.MaxQPHeldBytes)
	}
	return r.ep.Check(time.Now())
}

// checkRDAccounting is rdAccounting under the QP's RD lock.
func checkRDAccounting(q *QP) error {
	q.rd.mu.Lock()
	defer q.rd.mu.Unlock()
	return rdAccounting(q.rd)
}

// rdInfo returns what q's RD engine holds of peer (addr, qpn).
func rdInfo(q *QP, k rdKey) (reliability.PeerInfo, bool) {
	q.rd.mu.Lock()
	defer q.rd.mu.Unlock()
	return q.rd.ep.Info(reliability.PeerKey{Addr: k.addr, QPN: k.qpn})
}

// rdPeerCount is how many peers q's RD engine holds.
func rdPeerCount(q *QP) int {
	q.rd.mu.Lock()
	defer q.rd.mu.Unlock()
	return q.rd.ep.Peers()
}
