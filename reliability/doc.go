// Package reliability is the reliable-datagram (RD) layer below DDP:
// per-peer sequence numbers, cumulative and selective acknowledgements,
// retransmission from the registered buffer, flow control, congestion
// control and pacing, and the per-session epochs and tokens that tell
// one session between two QPs from the next, over one unconnected UDP
// socket.
//
// Loss detection and timeouts follow RFC 9002 §5-6. Congestion control
// (congestion.go, Config.Congestion) is BBR version 1 as
// draft-cardwell-iccrg-bbr-congestion-control-00 specifies it, the
// default, over the delivery-rate samples of
// draft-cheng-iccrg-delivery-rate-estimation-02; or NewReno per RFC 9002
// §7 (paced per §7.7); or none. The package does no I/O: the caller
// hands it packets, acks and the time, and asks it what to send and when
// (Sender.CanSend, Sender.SendAt, Sender.Deadline).
//
// Endpoint is the RD protocol of one QP on top of them (docs/wire.md
// §11): contact, sessions, the graveyard, the peer table, acks,
// retransmission, RNR, probes and pacing, as an engine that takes
// frames, posts and the time and answers through a Host (frames to
// send, deliveries, completions, peer events). simnet_test.go runs many
// Endpoints over a simulated network, every choice from one seed, and
// checks the invariants of exactly-once, in-order delivery after each
// run (go test -run TestSimCampaign -sim.seeds N for a campaign).
package reliability
