package qp

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/llp"
	"github.com/udiwarp/udiwarp/udiwarp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// mustPost ends the test if a post (PostSend, PostRecv, SRQ.PostRecv)
// returned an error: unchecked, a refused post shows only as a
// completion that never comes, a timeout far from its cause
// (internal/testlint's TestPostResultsChecked keeps every post checked).
// It calls t.Fatal, so only from the test's own goroutine.
func mustPost(t testing.TB, err error) {
	if err != nil {
		t.Helper()
		t.Fatalf("post: %v", err)
	}
}

// node is one side of a test: a device with a socket, a PD, a CQ, a UD QP
// in RTS and a registered buffer.
type node struct {
	t    testing.TB
	dev  *Device
	sock *Socket
	pd   *PD
	cq   *CQ
	qp   *QP
	mr   *MR
	buf  []byte
}

func newNode(t testing.TB, cfg DeviceConfig, network, addr string, opts ...BindOption) *node {
	t.Helper()
	dev, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	sock, err := dev.Bind(network, addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return nodeOn(t, dev, sock)
}

// newMemNode is newNode on an in-memory link of net at addr.
func newMemNode(t testing.TB, cfg DeviceConfig, net *llp.MemNet, addr string) *node {
	t.Helper()
	dev, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	l, err := net.Open(netip.MustParseAddrPort(addr))
	if err != nil {
		t.Fatal(err)
	}
	sock, err := dev.BindLink(l)
	if err != nil {
		t.Fatal(err)
	}
	return nodeOn(t, dev, sock)
}

// nodeOn is newNode's rest: a PD, a CQ, a 1 MiB MR and a UD QP on sock.
func nodeOn(t testing.TB, dev *Device, sock *Socket) *node {
	t.Helper()
	var err error
	n := &node{t: t, dev: dev, sock: sock, pd: dev.AllocPD(), buf: make([]byte, 1<<20)}
	if n.cq, err = dev.CreateCQ(4096); err != nil {
		t.Fatal(err)
	}
	if n.mr, err = n.pd.RegisterMemory(n.buf, AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	n.qp = n.newQP(QPAttr{Type: UD, SendCQ: n.cq, RecvCQ: n.cq, Caps: QPCaps{MaxSendWR: 1024, MaxRecvWR: 1024}})
	return n
}

// newQP creates a QP on the node's socket and brings it to RTS.
func (n *node) newQP(attr QPAttr) *QP {
	n.t.Helper()
	q, err := n.pd.CreateQP(attr)
	if err != nil {
		n.t.Fatal(err)
	}
	for _, st := range []ModifyAttr{{State: StateInit, Socket: n.sock}, {State: StateRTR}, {State: StateRTS}} {
		if err := q.Modify(st); err != nil {
			n.t.Fatal(err)
		}
	}
	return q
}

func (n *node) ah(to *node, q *QP) *AH {
	n.t.Helper()
	ah, err := n.pd.CreateAH(to.sock.LocalAddr(), q.QPN())
	if err != nil {
		n.t.Fatal(err)
	}
	return ah
}

// wait polls cq until it has k completions or a deadline passes.
func waitWC(t testing.TB, cq *CQ, k int) []WorkCompletion {
	t.Helper()
	out := make([]WorkCompletion, 0, k)
	wcs := make([]WorkCompletion, 64)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for len(out) < k {
		n := cq.Poll(wcs[:min(len(wcs), k-len(out))])
		out = append(out, wcs[:n]...)
		if n == 0 {
			if err := cq.Wait(ctx); err != nil {
				t.Fatalf("waiting for %d completions, have %d: %v", k, len(out), err)
			}
		}
	}
	return out
}

// sendQueueEmpty reports whether q's (UD) send queue is empty: every WR
// posted to it (PostSend having returned) has been sent or failed, and
// the completion it makes, if any, is in its CQ. A WR sent at once
// completes in PostSend; a queued one leaves the queue after its
// completion, both under sqMu.
func sendQueueEmpty(q *QP) bool {
	q.sqMu.Lock()
	defer q.sqMu.Unlock()
	return q.sq.len() == 0
}

func udiwarpSend(dstQP, srcQP uint32, payload []byte) []byte {
	h := udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: udiwarp.DatagramDDPVersion,
		RDMAP: udiwarp.NewRDMAPControl(udiwarp.OpSend), ULP: srcQP, QN: udiwarp.DatagramQN(dstQP, udiwarp.QueueSend), MSN: 1})
	return udiwarp.SealDatagram(append(h, payload...), 0)
}

// eventually waits up to 5 s for cond.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	// A bound only a hung test reaches, even under the race detector on
	// a loaded machine: what the test asserts is cond, not the time.
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// rxSettled returns once the batch s's receive path has in hand, if any,
// is handled: datagrams a counter says were read are then processed.
func rxSettled(s *Socket) {
	s.rxMu.Lock()
	//lint:ignore SA2001 an empty critical section on purpose: it orders the test after the batch in hand
	s.rxMu.Unlock()
}
