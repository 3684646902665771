// Package reliability is the reliable-datagram (RD) layer below DDP:
// per-peer sequence numbers, cumulative and selective acknowledgements,
// retransmission from the registered buffer, flow control, and the
// per-session epochs and tokens that tell one session between two QPs
// from the next, over one unconnected UDP socket.
package reliability
