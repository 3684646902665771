package qp

import (
	"errors"
	"testing"
)

// byHand is the bring-up Activate replaces, as the callers wrote it.
func byHand(q *QP, sock *Socket) error {
	for _, st := range []ModifyAttr{{State: StateInit, Socket: sock}, {State: StateRTR}, {State: StateRTS}} {
		if err := q.Modify(st); err != nil {
			return err
		}
	}
	return nil
}

// TestActivate: Activate leaves a UD or RD QP in RTS on the socket asked,
// and the QP then works: it receives a Send on that socket.
func TestActivate(t *testing.T) {
	n := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	for _, typ := range []QPType{UD, RD} {
		t.Run(typ.String(), func(t *testing.T) {
			sock, err := n.dev.Bind("udp4", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			q, err := n.pd.CreateQP(QPAttr{Type: typ, SendCQ: n.cq, RecvCQ: n.cq})
			if err != nil {
				t.Fatal(err)
			}
			defer q.Destroy()
			if err := q.Activate(sock); err != nil {
				t.Fatal(err)
			}
			if q.State() != StateRTS || q.Socket() != sock {
				t.Fatalf("after Activate: %v on %p, want RTS on %p", q.State(), q.Socket(), sock)
			}
			if typ != UD {
				return
			}
			if err := q.PostRecv(&RecvWR{ID: 5, SGL: []SGE{n.mr.SGE(0, 64)}}); err != nil {
				t.Fatal(err)
			}
			ah, err := n.pd.CreateAH(sock.LocalAddr(), q.QPN())
			if err != nil {
				t.Fatal(err)
			}
			if err := n.qp.PostSend(&SendWR{Inline: []byte("up"), AH: ah}); err != nil {
				t.Fatal(err)
			}
			if wc := waitWC(t, n.cq, 1)[0]; wc.ID != 5 || wc.Status != Success || wc.Len != 2 || wc.QPN != q.QPN() {
				t.Fatalf("receive on the activated QP: %+v", wc)
			}
		})
	}

	// A QP that got its socket in an earlier Modify to INIT is activated
	// with a nil socket and keeps it.
	q, err := n.pd.CreateQP(QPAttr{Type: UD, SendCQ: n.cq, RecvCQ: n.cq})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Destroy()
	if err := q.Modify(ModifyAttr{State: StateInit, Socket: n.sock}); err != nil {
		t.Fatal(err)
	}
	if err := q.Activate(nil); err != nil {
		t.Fatal(err)
	}
	if q.State() != StateRTS || q.Socket() != n.sock {
		t.Fatalf("Activate(nil) in INIT: %v on %p, want RTS on %p", q.State(), q.Socket(), n.sock)
	}
}

// TestActivateErrors: for each reason a bring-up fails, Activate returns
// the error the Modify calls by hand return (the same error, the same
// text) and leaves the QP where they leave it.
func TestActivateErrors(t *testing.T) {
	n := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	other := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	create := func(t *testing.T, typ QPType, to ...QPState) *QP {
		t.Helper()
		q, err := n.pd.CreateQP(QPAttr{Type: typ, SendCQ: n.cq, RecvCQ: n.cq})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { q.Destroy() })
		for _, st := range to {
			a := ModifyAttr{State: st}
			if st == StateInit {
				a.Socket = n.sock
			}
			if err := q.Modify(a); err != nil {
				t.Fatal(err)
			}
		}
		return q
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T) (*QP, *Socket)
		want  error
		state QPState // where the QP is left
	}{
		{"device closed", func(t *testing.T) (*QP, *Socket) {
			dev, err := Open(DeviceConfig{})
			if err != nil {
				t.Fatal(err)
			}
			sock, err := dev.Bind("udp4", "127.0.0.1:0")
			if err != nil {
				dev.Close()
				t.Fatal(err)
			}
			cq, err := dev.CreateCQ(16)
			if err != nil {
				dev.Close()
				t.Fatal(err)
			}
			q, err := dev.AllocPD().CreateQP(QPAttr{Type: UD, SendCQ: cq, RecvCQ: cq})
			dev.Close()
			if err != nil {
				t.Fatal(err)
			}
			return q, sock
		}, ErrClosed, StateError},
		{"socket of another device", func(t *testing.T) (*QP, *Socket) {
			return create(t, UD), other.sock
		}, ErrInvalidAttr, StateReset},
		{"no socket", func(t *testing.T) (*QP, *Socket) {
			return create(t, UD), nil
		}, ErrInvalidAttr, StateInit},
		{"in RTR", func(t *testing.T) (*QP, *Socket) {
			return create(t, UD, StateInit, StateRTR), n.sock
		}, ErrQPState, StateRTR},
		{"in RTS", func(t *testing.T) (*QP, *Socket) {
			return create(t, RD, StateInit, StateRTR, StateRTS), n.sock
		}, ErrQPState, StateRTS},
		{"in ERROR", func(t *testing.T) (*QP, *Socket) {
			return create(t, UD, StateError), n.sock
		}, ErrQPState, StateError},
		{"RC QP with a socket", func(t *testing.T) (*QP, *Socket) {
			return create(t, RC), n.sock
		}, ErrInvalidAttr, StateReset},
		{"RC QP without a connection", func(t *testing.T) (*QP, *Socket) {
			return create(t, RC), nil
		}, ErrQPState, StateInit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hq, hsock := tc.setup(t)
			herr := byHand(hq, hsock)
			aq, asock := tc.setup(t)
			aerr := aq.Activate(asock)
			if !errors.Is(herr, tc.want) {
				t.Fatalf("by hand: %v, want %v (the case does not test what it says)", herr, tc.want)
			}
			if !errors.Is(aerr, tc.want) || aerr.Error() != herr.Error() {
				t.Fatalf("Activate: %v, want %v as by hand", aerr, herr)
			}
			if aq.State() != tc.state || hq.State() != tc.state {
				t.Fatalf("left in %v (by hand %v), want %v", aq.State(), hq.State(), tc.state)
			}
			if (aq.Socket() == nil) != (hq.Socket() == nil) {
				t.Fatalf("socket after Activate %p, by hand %p", aq.Socket(), hq.Socket())
			}
		})
	}
}

// TestModifyRefusedLeavesSocket: a Modify that is refused changes nothing,
// the QP's socket included (an RC QP refused a UDP socket but kept it).
func TestModifyRefusedLeavesSocket(t *testing.T) {
	n := newNode(t, DeviceConfig{}, "udp4", "127.0.0.1:0")
	rc, err := n.pd.CreateQP(QPAttr{Type: RC, SendCQ: n.cq, RecvCQ: n.cq})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Destroy()
	if err := rc.Modify(ModifyAttr{State: StateInit, Socket: n.sock}); !errors.Is(err, ErrInvalidAttr) {
		t.Fatalf("an RC QP given a UDP socket: %v, want ErrInvalidAttr", err)
	}
	if rc.Socket() != nil || rc.State() != StateReset {
		t.Fatalf("after the refusal: socket %p, state %v; want none, RESET", rc.Socket(), rc.State())
	}
	// A datagram QP refused a socket for its state keeps the one it has.
	other, err := n.dev.Bind("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := n.qp.Modify(ModifyAttr{State: StateError, Socket: other}); !errors.Is(err, ErrQPState) {
		t.Fatalf("a socket in RTS: %v, want ErrQPState", err)
	}
	if n.qp.Socket() != n.sock || n.qp.State() != StateRTS {
		t.Fatalf("after the refusal: socket %p (want %p), state %v", n.qp.Socket(), n.sock, n.qp.State())
	}
}
