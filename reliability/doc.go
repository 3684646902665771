// Package reliability is the reliable-datagram (RD) layer below DDP:
// per-peer sequence numbers, cumulative and selective acknowledgements,
// retransmission from the registered buffer, flow control and peer epochs,
// over one unconnected UDP socket.
package reliability
