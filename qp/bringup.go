package qp

// Activate brings a datagram (UD or RD) QP up: it binds the QP to sock
// and walks it INIT→RTR→RTS, the three Modify calls every datagram QP
// makes before it can send:
//
//	q.Modify(ModifyAttr{State: StateInit, Socket: sock})
//	q.Modify(ModifyAttr{State: StateRTR})
//	q.Modify(ModifyAttr{State: StateRTS})
//
// sock may be nil when the QP already has its socket (an earlier
// Modify to INIT set it). The first Modify that fails stops the walk and
// its error is returned as it is (errors.Is matches ErrClosed,
// ErrQPState or ErrInvalidAttr as for Modify); the QP stays in the state
// the steps before it reached. A QP that is not in RESET or INIT cannot
// be activated (INIT is reachable only from there). An RC QP reaches RTS
// through Connect or RCRequest.Accept instead.
func (q *QP) Activate(sock *Socket) error {
	if err := q.Modify(ModifyAttr{State: StateInit, Socket: sock}); err != nil {
		return err
	}
	if err := q.Modify(ModifyAttr{State: StateRTR}); err != nil {
		return err
	}
	return q.Modify(ModifyAttr{State: StateRTS})
}
