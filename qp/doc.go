// Package qp is the verbs library of udiwarp: Device, protection domains,
// memory regions and STags, completion queues, shared receive queues,
// address handles, and queue pairs of type UD, RD and RC with the verbs
// states RESET, INIT, RTR, RTS and ERROR. PostSend never blocks: it sends
// in the caller's goroutine when it can and hands the rest to the
// device's datamover. Remote access and the package's inside are in
// docs/verbs.md ("What a peer can hold", "Inside qp").
package qp
