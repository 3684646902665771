package qp

import (
	"fmt"
	"net/netip"
	"time"
)

// rdAccounting checks the RD QP's books against its peers: each source
// address's peer count is the number of peers it has (no count left
// behind by a peer dropped some other way than rdForget), and the bytes
// held ahead of gaps are the peers' sum, none negative, within the
// budgets. The caller holds r.mu.
func rdAccounting(r *rdQP) error {
	count := map[netip.Addr]int{}
	held, posted := 0, 0
	for k, p := range r.peers {
		count[k.addr.Addr()]++
		if p.held < 0 || p.held > r.cfg.MaxHeldBytes {
			return fmt.Errorf("RD peer %v holds %d bytes, budget %d", k, p.held, r.cfg.MaxHeldBytes)
		}
		held += p.held
		if p.outstanding != len(p.posted)-p.postedAt {
			return fmt.Errorf("RD peer %v: %d WRs outstanding, %d posted and not completed", k, p.outstanding, len(p.posted)-p.postedAt)
		}
		for _, w := range p.posted[p.postedAt:] {
			if w.peer != p {
				return fmt.Errorf("RD peer %v holds a WR posted to %v", k, w.peer.key)
			}
		}
		posted += p.outstanding
	}
	// Every WR not completed is its peer's, and its peer is in the table
	// (rdFlush relies on it); between operations none waits to complete.
	if posted != r.nout || len(r.ready) != 0 {
		return fmt.Errorf("RD QP: %d WRs not completed, its peers hold %d; %d peers not completed", r.nout, posted, len(r.ready))
	}
	for a, n := range r.perAddr {
		if count[a] != n.n {
			return fmt.Errorf("address %v counted for %d RD peers, has %d", a, n.n, count[a])
		}
	}
	for a, n := range count {
		if r.perAddr[a].n != n {
			return fmt.Errorf("address %v has %d RD peers, counted for %d", a, n, r.perAddr[a].n)
		}
	}
	if held != r.held || r.held > r.cfg.MaxQPHeldBytes {
		return fmt.Errorf("RD QP holds %d bytes, its peers %d, budget %d", r.held, held, r.cfg.MaxQPHeldBytes)
	}
	return rdTableCheck(r, time.Now())
}

// checkRDAccounting is rdAccounting under the QP's RD lock.
func checkRDAccounting(q *QP) error {
	q.rd.mu.Lock()
	defer q.rd.mu.Unlock()
	return rdAccounting(q.rd)
}
