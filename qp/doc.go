// Package qp is the verbs library of udiwarp: Device, protection domains,
// memory regions and STags, completion queues, shared receive queues,
// address handles, and queue pairs of type UD, RD and RC with the verbs
// states RESET, INIT, RTR, RTS and ERROR. PostSend never blocks: it sends
// in the caller's goroutine when it can and hands the rest to the device's
// datamover.
//
// Remote access: memory regions are zero-based (a tagged offset is an
// offset into the region; MR.Addr is 0) and their STags are 32 random
// bits. Every tagged placement and every tagged read, on every QP type,
// passes one check (STag and key, protection domain, access not revoked,
// bounds). MR.Invalidate, or a peer's Send with Invalidate for an STag
// registered with AccessRemoteInvalidate, revokes remote access at once
// and for good (docs/verbs.md, docs/wire.md §4.4).
package qp
