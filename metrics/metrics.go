// Package metrics exports the counters of udiwarp devices to Prometheus:
// a prometheus.Collector over one or more qp.Devices, each under its
// "device" label, with every counter qp.Stats has, the Write-Record
// engines' outcomes and the gauges of qp.Device.Levels, named by Prometheus conventions
// (udiwarp_…_total, snake_case label values). The counters are read when
// Prometheus scrapes; nothing is added to the data path.
//
//	c := metrics.New()
//	c.Add("dev0", dev)
//	prometheus.MustRegister(c)
//	http.Handle("/metrics", promhttp.Handler())
//
// or, with its own registry and the Go runtime's metrics,
// http.Handle("/metrics", c.Handler()).
package metrics

import (
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/udiwarp/udiwarp/qp"
	"github.com/udiwarp/udiwarp/writerecord"
)

// Collector reads the stats of the devices added to it. Devices added
// under one name are one series: their counts add up, and a device that
// closes keeps its last counts in that sum while the device itself is let
// go (at the next Add or scrape). So a process that opens a device per
// run under one name keeps one series and holds only its open devices.
type Collector struct {
	mu    sync.Mutex
	names []string // in the order first added
	open  map[string][]*qp.Device
	gone  map[string][]float64 // the final counts of closed devices, by series
}

// New returns an empty Collector.
func New() *Collector {
	return &Collector{open: map[string][]*qp.Device{}, gone: map[string][]float64{}}
}

// Add makes the collector report d under the label device="name".
func (c *Collector) Add(name string, d *qp.Device) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.retireLocked()
	if _, ok := c.open[name]; !ok {
		if _, ok := c.gone[name]; !ok {
			c.names = append(c.names, name)
		}
	}
	c.open[name] = append(c.open[name], d)
}

// Adder returns a function that adds each device it is given under name,
// as callbacks such as perf.Config.OnDevice want.
func (c *Collector) Adder(name string) func(*qp.Device) {
	return func(d *qp.Device) { c.Add(name, d) }
}

// Devices says how many devices the collector holds open (and any closed
// since the last Add or scrape).
func (c *Collector) Devices() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, ds := range c.open {
		n += len(ds)
	}
	return n
}

// retireLocked folds the counts of the devices that closed into gone and
// forgets them.
func (c *Collector) retireLocked() {
	for name, ds := range c.open {
		keep := ds[:0]
		for _, d := range ds {
			if !d.Closed() {
				keep = append(keep, d)
				continue
			}
			sum := c.gone[name]
			if sum == nil {
				sum = make([]float64, len(table))
				c.gone[name] = sum
			}
			read(sum, d)
		}
		clear(ds[len(keep):])
		c.open[name] = keep
	}
}

// read adds d's counts to sum, one per entry of table.
func read(sum []float64, d *qp.Device) {
	sn := snapshot{st: d.Stats(), d: d}
	sn.wr, sn.inProgress = d.WriteRecordStats()
	sn.lv = d.Levels()
	closed := d.Closed()
	for i, s := range table {
		if s.gauge && closed { // a closed device holds nothing in progress
			continue
		}
		sum[i] += float64(s.get(&sn))
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, f := range families {
		ch <- f.desc
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	c.retireLocked()
	names := append([]string(nil), c.names...)
	sums := make(map[string][]float64, len(names))
	open := make(map[string][]*qp.Device, len(names))
	for _, name := range names {
		sum := make([]float64, len(table))
		copy(sum, c.gone[name])
		sums[name] = sum
		open[name] = append([]*qp.Device(nil), c.open[name]...)
	}
	c.mu.Unlock()
	for _, name := range names {
		sum := sums[name]
		for _, d := range open[name] {
			read(sum, d)
		}
		for i, s := range table {
			labels := []string{name}
			if s.value != "" {
				labels = append(labels, s.value)
			}
			ch <- prometheus.MustNewConstMetric(s.fam.desc, s.fam.kind, sum[i], labels...)
		}
	}
}

// Handler serves the collector's metrics, and the Go runtime's, in a
// registry of their own.
func (c *Collector) Handler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, collectors.NewGoCollector())
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

// family is one metric name; label is its second label (after device),
// or "".
type family struct {
	name, help, label string
	kind              prometheus.ValueType
	desc              *prometheus.Desc
}

// series is one series of a family per device: the label value and where
// its count comes from.
type series struct {
	fam   *family
	value string
	get   func(*snapshot) uint64
	gauge bool // what the device holds now, not a count: nothing once it closed
}

// snapshot is what one scrape reads of a device.
type snapshot struct {
	d          *qp.Device
	st         *qp.Stats
	wr         writerecord.Stats
	inProgress int
	lv         qp.Levels
}

func counter(name, help, label string) family {
	return family{name: "udiwarp_" + name, help: help, label: label, kind: prometheus.CounterValue}
}

var (
	datagrams   = counter("datagrams_total", "UDP datagrams, by direction.", "direction")
	wireBytes   = counter("transferred_bytes_total", "Bytes on the wire (UDP payloads, TCP stream octets), by direction.", "direction")
	dropped     = counter("dropped_total", "Received datagrams dropped, by reason (qp.Stats).", "reason")
	delivered   = counter("messages_delivered_total", "Messages placed and completed at receivers.", "")
	landed      = counter("messages_landed_total", "Messages of udiwarp_messages_delivered_total received straight into the posted buffers.", "")
	multicast   = counter("multicast_copies_total", "Copies of multicast datagrams delivered to member QPs.", "")
	remoteErr   = counter("remote_errors_received_total", "Error messages (Terminates) received from peers on datagram QPs.", "")
	rdFrames    = counter("rd_frames_received_total", "RD frames read from sockets.", "")
	rfc7306     = counter("rfc7306_operations_total", "RFC 7306 operations carried out at targets, by kind: atomics executed (each once), Immediate Data messages delivered.", "operation")
	completions = counter("completions_total", "Work completions the devices' CQs took, by status.", "status")
	wrSegments  = counter("write_record_segments_total", "Write-Record segments at targets, by fate: placed, or dropped by the engine (stale, duplicate, far_ahead, mismatch: docs/wire.md §4.3).", "fate")
	wrMessages  = counter("write_record_messages_total", "Write-Record messages at the targets' engines, by outcome (superseded and fragmented messages also count as partial or discarded).", "outcome")
	wrForgot    = counter("write_record_keys_forgotten_total", "Write-Record keys (source, STag) whose newest MSN a target's engine forgot at its MaxRemembered cap: a straggler of theirs may start a message again (docs/wire.md §4.3).", "")
	wrRecords   = counter("write_record_records_total", "Write-Record messages the target QPs recorded (completion entries or validity maps), by kind.", "kind")
	rdPeers     = counter("rd_peer_states_total", "RD peer states, by event: created, reclaimed (idle or at the cap), restarted (a new session), failed (retry limit).", "event")
	rdFramesOut = counter("rd_frames_sent_total", "RD frames sent, by kind: data (retransmissions included), standalone acks, control (no payload), challenges, zero-window probes; the kinds overlap, so do not sum them.", "kind")
	rdRetrans   = counter("rd_retransmissions_total", "RD Data frames sent again.", "")
	rdBuffered  = counter("rd_frames_buffered_total", "RD Data frames held ahead of a gap.", "")
	rdRNR       = counter("rd_receiver_not_ready_total", "RD Sends refused for want of a posted receive (receiver not ready).", "")
	rdTagged    = counter("rd_tagged_segments_placed_total", "RD RDMA Write and Read Response segments placed.", "")
	rdReads     = counter("rd_reads_total", "RD Read Requests at responders, by outcome: served, refused (over IRD), flushed (region deregistered).", "outcome")
	timers      = counter("timer_runs_total", "Runs of the device timer (Write-Record deadlines, RD and RC timers).", "")
	rcFPDUs     = counter("rc_fpdus_total", "RC MPA FPDUs, by direction.", "direction")
	rcTerms     = counter("rc_terminates_total", "RC Terminate messages, by direction.", "direction")
	rcEvents    = counter("rc_errors_total", "RC failures, by kind: reads_over_ird, connections_lost, bad_mpa_requests, handshakes_shed.", "kind")
	rcHeld      = counter("rc_sends_held_total", "RC sends that found their socket full and held the rest back (held), and the times the device's poller, woken by room, sent what was held (poller_sent; event polling only: busy polling sends it from CQ.Poll).", "kind")
	rcWaits     = counter("rc_recv_waits_total", "Sends on WaitForRecv RC connections (the sockets preload's streams) that found no receive and waited for one, reading stopped meanwhile.", "")
	txPaths     = counter("send_events_total", "Events of the datagram send path: direct (sent in the poster's goroutine), queued (handed to the datamover), gso (a sendmsg carrying several datagrams), parked (the socket was full), errors (sendmsg failed); the events overlap, so do not sum them.", "event")
	impaired    = counter("impaired_datagrams_total", "Datagrams the software impairment layer dropped, corrupted, duplicated, reordered or delayed, by direction (qp.DeviceConfig Impair and ImpairRx; udperf -loss).", "direction")
	withheld    = counter("replies_withheld_total", "Error messages and RD Challenges not sent: larger than what drew them, or drawn by a multicast or broadcast datagram.", "")
	events      = counter("async_events_total", "Asynchronous events raised, queued or not, by type.", "type")
	cqDropped   = counter("completions_dropped_total", "Completions CQs refused after overflowing.", "")
	eventsLost  = counter("async_events_dropped_total", "Asynchronous events not queued, by origin: the device's own (Events full) or a peer's (coalesced or over their share).", "origin")
	protected   = counter("protected_datagrams_total", "Protected datagrams (qp.DeviceConfig.Protect), by event: sealed, opened, contacts (Hellos and Challenges sent with a key share), refuses_sent, refused_contacts (Refuse answers that ended a contact of ours), tx_no_key (not sent: no key for the peer).", "event")
	protKeys    = counter("protected_keys_total", "Keys a protected device installed, by origin: session (an RD contact), psk (a pre-shared key), key_update (a receive key moved to its next generation).", "origin")
	srqRecouped = counter("srq_recouped_receives_total", "Receives reserved for idle QPs that their SRQs recouped for others (qp.SRQLimits.Reserve).", "")

	wrInProgress   = family{name: "udiwarp_write_record_in_progress", help: "Write-Record messages in progress at targets.", kind: prometheus.GaugeValue}
	validityRanges = family{name: "udiwarp_validity_map_ranges", help: "Disjoint valid ranges in the regions' validity maps.", kind: prometheus.GaugeValue}
	rdPeersNow     = family{name: "udiwarp_rd_peers", help: "Peer states the RD QPs hold now.", kind: prometheus.GaugeValue}
	rcConnsNow     = family{name: "udiwarp_rc_connections", help: "RC QPs with a live connection now.", kind: prometheus.GaugeValue}
	srqReceives    = family{name: "udiwarp_srq_receives", help: "Receives posted to shared receive queues and not yet taken.", kind: prometheus.GaugeValue}
	srqCapacity    = family{name: "udiwarp_srq_capacity", help: "Receives the shared receive queues hold when full.", kind: prometheus.GaugeValue}
	srqHeld        = family{name: "udiwarp_srq_held", help: "Receives the shared receive queues' QPs hold: taken by a message, not yet polled from a CQ.", kind: prometheus.GaugeValue}
)

// families are table's, in order of first use.
var families []*family

func init() {
	for _, s := range table {
		if f := s.fam; f.desc == nil {
			labels := []string{"device"}
			if f.label != "" {
				labels = append(labels, f.label)
			}
			f.desc = prometheus.NewDesc(f.name, f.help, labels, nil)
			families = append(families, f)
		}
	}
}

// statusLabel is a completion status as a label value: snake_case.
var statusLabel = [...]string{
	qp.Success: "success", qp.LocalLengthError: "local_length_error", qp.LocalQPOperationError: "local_qp_operation_error",
	qp.LocalProtectionError: "local_protection_error", qp.WRFlushError: "wr_flush_error", qp.RemoteAccessError: "remote_access_error",
	qp.RemoteOperationError: "remote_operation_error", qp.RetryExceededError: "retry_exceeded_error", qp.GeneralError: "general_error",
	qp.RemoteInvalidRequestError: "remote_invalid_request_error", qp.RNRRetryExceededError: "rnr_retry_exceeded_error",
	qp.RemoteAbortedError: "remote_aborted_error", qp.ProtectionModeError: "protection_mode_error",
}

// eventLabel is an asynchronous event type as a label value.
var eventLabel = [...]string{
	qp.AsyncCQOverflow: "cq_overflow", qp.AsyncSRQLimit: "srq_limit", qp.AsyncSRQOverdraft: "srq_overdraft",
	qp.AsyncRemoteError: "remote_error", qp.AsyncQPFatal: "qp_fatal", qp.AsyncSRQSoftLimit: "srq_soft_limit",
	qp.AsyncSRQPeerLimit: "srq_peer_limit", qp.AsyncSRQTotalLimit: "srq_total_limit", qp.AsyncSRQOutOfOrder: "srq_out_of_order",
}

// table is every series a device has, in a fixed order.
var table = func() []series {
	s := func(f *family, value string, get func(*qp.Stats) uint64) series {
		return series{fam: f, value: value, get: func(sn *snapshot) uint64 { return get(sn.st) }}
	}
	w := func(f *family, value string, get func(*writerecord.Stats) uint64) series {
		return series{fam: f, value: value, get: func(sn *snapshot) uint64 { return get(&sn.wr) }}
	}
	t := []series{
		s(&datagrams, "in", func(s *qp.Stats) uint64 { return s.RxDatagrams.Load() }),
		s(&datagrams, "out", func(s *qp.Stats) uint64 { return s.TxDatagrams.Load() }),
		s(&wireBytes, "in", func(s *qp.Stats) uint64 { return s.RxBytes.Load() }),
		s(&wireBytes, "out", func(s *qp.Stats) uint64 { return s.TxBytes.Load() }),

		s(&dropped, "truncated", func(s *qp.Stats) uint64 { return s.RxTruncated.Load() }),
		s(&dropped, "too_long", func(s *qp.Stats) uint64 { return s.RxTooLong.Load() }),
		s(&dropped, "crc", func(s *qp.Stats) uint64 { return s.RxBadCRC.Load() }),
		s(&dropped, "bad_version", func(s *qp.Stats) uint64 { return s.RxBadVersion.Load() }),
		s(&dropped, "bad_header", func(s *qp.Stats) uint64 { return s.RxBadHeader.Load() }),
		s(&dropped, "bad_opcode", func(s *qp.Stats) uint64 { return s.RxBadOpcode.Load() }),
		s(&dropped, "unknown_qp", func(s *qp.Stats) uint64 { return s.RxUnknownQP.Load() }),
		s(&dropped, "qp_state", func(s *qp.Stats) uint64 { return s.RxQPState.Load() }),
		s(&dropped, "no_recv", func(s *qp.Stats) uint64 { return s.RxNoRecv.Load() }),
		s(&dropped, "srq_overdraft", func(s *qp.Stats) uint64 { return s.RxSRQOverdraft.Load() }),
		s(&dropped, "srq_peer_limit", func(s *qp.Stats) uint64 { return s.RxSRQPeerLimit.Load() }),
		s(&dropped, "srq_total_limit", func(s *qp.Stats) uint64 { return s.RxSRQTotalLimit.Load() }),
		s(&dropped, "srq_out_of_order", func(s *qp.Stats) uint64 { return s.RxSRQOutOfOrder.Load() }),
		s(&dropped, "recv_too_small", func(s *qp.Stats) uint64 { return s.RxRecvTooSmall.Load() }),
		s(&dropped, "recv_protection", func(s *qp.Stats) uint64 { return s.RxRecvProt.Load() }),
		s(&dropped, "bad_stag", func(s *qp.Stats) uint64 { return s.RxBadSTag.Load() }),
		s(&dropped, "access", func(s *qp.Stats) uint64 { return s.RxAccess.Load() }),
		s(&dropped, "bounds", func(s *qp.Stats) uint64 { return s.RxBounds.Load() }),
		s(&dropped, "misaligned", func(s *qp.Stats) uint64 { return s.RxMisaligned.Load() }),
		s(&dropped, "write_record_engine", func(s *qp.Stats) uint64 { return s.RxWRStale.Load() }),
		s(&dropped, "rd_unvalidated", func(s *qp.Stats) uint64 { return s.RDRejected.Load() }),
		s(&dropped, "rd_peer_cap", func(s *qp.Stats) uint64 { return s.RDRefused.Load() }),
		s(&dropped, "rd_address_limit", func(s *qp.Stats) uint64 { return s.RDAddrLimited.Load() }),
		s(&dropped, "rd_bad_ack", func(s *qp.Stats) uint64 { return s.RDBadAcks.Load() }),
		s(&dropped, "protect_auth_failed", func(s *qp.Stats) uint64 { return s.ProtAuthFailed.Load() }),
		s(&dropped, "protect_replayed", func(s *qp.Stats) uint64 { return s.ProtReplayed.Load() }),
		s(&dropped, "protect_no_key", func(s *qp.Stats) uint64 { return s.ProtNoKey.Load() }),
		s(&dropped, "protect_clear", func(s *qp.Stats) uint64 { return s.ProtClear.Load() }),
		s(&dropped, "protect_bad_envelope", func(s *qp.Stats) uint64 { return s.ProtBadEnvelope.Load() }),
		s(&dropped, "protect_mode_mismatch", func(s *qp.Stats) uint64 { return s.ProtModeMismatch.Load() }),
		s(&dropped, "protect_unsolicited", func(s *qp.Stats) uint64 { return s.ProtUnsolicited.Load() }),
		s(&dropped, "protect_reflected", func(s *qp.Stats) uint64 { return s.ProtReflected.Load() }),
		s(&dropped, "protect_contact_limited", func(s *qp.Stats) uint64 { return s.ProtContactLimited.Load() }),
		s(&dropped, "protect_peers_full", func(s *qp.Stats) uint64 { return s.ProtPeersFull.Load() }),
		s(&dropped, "protect_wrong_source", func(s *qp.Stats) uint64 { return s.ProtWrongSource.Load() }),
		s(&protected, "sealed", func(s *qp.Stats) uint64 { return s.ProtSealed.Load() }),
		s(&protected, "opened", func(s *qp.Stats) uint64 { return s.ProtOpened.Load() }),
		s(&protected, "contacts", func(s *qp.Stats) uint64 { return s.ProtContacts.Load() }),
		s(&protected, "refuses_sent", func(s *qp.Stats) uint64 { return s.ProtRefusesSent.Load() }),
		s(&protected, "refused_contacts", func(s *qp.Stats) uint64 { return s.ProtRefused.Load() }),
		s(&protected, "tx_no_key", func(s *qp.Stats) uint64 { return s.ProtTxNoKey.Load() }),
		s(&protKeys, "session", func(s *qp.Stats) uint64 { return s.ProtSessions.Load() }),
		s(&protKeys, "psk", func(s *qp.Stats) uint64 { return s.ProtPSKPeers.Load() }),
		s(&protKeys, "key_update", func(s *qp.Stats) uint64 { return s.ProtKeyUpdates.Load() }),
		s(&dropped, "rd_duplicate", func(s *qp.Stats) uint64 { return s.RDDuplicates.Load() }),
		s(&dropped, "rd_beyond_window", func(s *qp.Stats) uint64 { return s.RDBeyondWindow.Load() }),
		s(&dropped, "rd_over_budget", func(s *qp.Stats) uint64 { return s.RDOverBudget.Load() }),

		s(&delivered, "", func(s *qp.Stats) uint64 { return s.RxDelivered.Load() }),
		s(&landed, "", func(s *qp.Stats) uint64 { return s.RxLanded.Load() }),
		s(&multicast, "", func(s *qp.Stats) uint64 { return s.RxMulticast.Load() }),
		s(&remoteErr, "", func(s *qp.Stats) uint64 { return s.RxRemoteErrors.Load() }),
		s(&rdFrames, "", func(s *qp.Stats) uint64 { return s.RxRDFrames.Load() }),
		s(&rfc7306, "atomic", func(s *qp.Stats) uint64 { return s.RxAtomics.Load() }),
		s(&rfc7306, "immediate", func(s *qp.Stats) uint64 { return s.RxImmediate.Load() }),

		s(&wrSegments, "placed", func(s *qp.Stats) uint64 { return s.RxWRPlaced.Load() }),
		w(&wrSegments, "stale", func(w *writerecord.Stats) uint64 { return w.Stale }),
		w(&wrSegments, "duplicate", func(w *writerecord.Stats) uint64 { return w.Duplicate }),
		w(&wrSegments, "far_ahead", func(w *writerecord.Stats) uint64 { return w.FarAhead }),
		w(&wrSegments, "mismatch", func(w *writerecord.Stats) uint64 { return w.Mismatch }),
		s(&wrRecords, "complete", func(s *qp.Stats) uint64 { return s.RxWRComplete.Load() }),
		s(&wrRecords, "partial", func(s *qp.Stats) uint64 { return s.RxWRPartial.Load() }),
		w(&wrMessages, "completed", func(w *writerecord.Stats) uint64 { return w.Completed }),
		w(&wrMessages, "partial", func(w *writerecord.Stats) uint64 { return w.Partial }),
		w(&wrMessages, "discarded", func(w *writerecord.Stats) uint64 { return w.Expired }),
		w(&wrMessages, "superseded", func(w *writerecord.Stats) uint64 { return w.Superseded }),
		w(&wrMessages, "evicted", func(w *writerecord.Stats) uint64 { return w.Evicted }),
		w(&wrMessages, "displaced", func(w *writerecord.Stats) uint64 { return w.Displaced }),
		w(&wrMessages, "fragmented", func(w *writerecord.Stats) uint64 { return w.Fragmented }),
		w(&wrForgot, "", func(w *writerecord.Stats) uint64 { return w.Forgotten }),

		s(&rdPeers, "created", func(s *qp.Stats) uint64 { return s.RDPeers.Load() }),
		s(&rdPeers, "reclaimed", func(s *qp.Stats) uint64 { return s.RDPeersReclaimed.Load() }),
		s(&rdPeers, "restarted", func(s *qp.Stats) uint64 { return s.RDPeerRestarts.Load() }),
		s(&rdPeers, "failed", func(s *qp.Stats) uint64 { return s.RDPeerFailures.Load() }),
		s(&rdFramesOut, "data", func(s *qp.Stats) uint64 { return s.RDDataSent.Load() }),
		s(&rdFramesOut, "ack", func(s *qp.Stats) uint64 { return s.RDAcksSent.Load() }),
		s(&rdFramesOut, "control", func(s *qp.Stats) uint64 { return s.RDControlSent.Load() }),
		s(&rdFramesOut, "challenge", func(s *qp.Stats) uint64 { return s.RDChallenges.Load() }),
		s(&rdFramesOut, "window_probe", func(s *qp.Stats) uint64 { return s.RDWindowProbes.Load() }),
		s(&rdRetrans, "", func(s *qp.Stats) uint64 { return s.RDRetransmits.Load() }),
		s(&rdBuffered, "", func(s *qp.Stats) uint64 { return s.RDBuffered.Load() }),
		s(&rdRNR, "", func(s *qp.Stats) uint64 { return s.RDNotReady.Load() }),
		s(&rdTagged, "", func(s *qp.Stats) uint64 { return s.RDWritePlaced.Load() }),
		s(&rdReads, "served", func(s *qp.Stats) uint64 { return s.RDReadsServed.Load() }),
		s(&rdReads, "refused", func(s *qp.Stats) uint64 { return s.RDReadsRefused.Load() }),
		s(&rdReads, "flushed", func(s *qp.Stats) uint64 { return s.RDReadsFlushed.Load() }),
		s(&timers, "", func(s *qp.Stats) uint64 { return s.Timers.Load() }),

		s(&rcFPDUs, "out", func(s *qp.Stats) uint64 { return s.RCFPDUsSent.Load() }),
		s(&rcFPDUs, "in", func(s *qp.Stats) uint64 { return s.RCFPDUsReceived.Load() }),
		s(&rcTerms, "out", func(s *qp.Stats) uint64 { return s.RCTerminatesSent.Load() }),
		s(&rcTerms, "in", func(s *qp.Stats) uint64 { return s.RCTerminatesReceived.Load() }),
		s(&rcEvents, "reads_over_ird", func(s *qp.Stats) uint64 { return s.RCReadsOverIRD.Load() }),
		s(&rcEvents, "connections_lost", func(s *qp.Stats) uint64 { return s.RCConnectionsLost.Load() }),
		s(&rcEvents, "bad_mpa_requests", func(s *qp.Stats) uint64 { return s.RCBadRequests.Load() }),
		s(&rcEvents, "handshakes_shed", func(s *qp.Stats) uint64 { return s.RCHandshakesShed.Load() }),
		s(&rcHeld, "held", func(s *qp.Stats) uint64 { return s.RCSocketFull.Load() }),
		s(&rcHeld, "poller_sent", func(s *qp.Stats) uint64 { return s.RCPollerSends.Load() }),
		s(&rcWaits, "", func(s *qp.Stats) uint64 { return s.RCRecvWaits.Load() }),

		s(&txPaths, "direct", func(s *qp.Stats) uint64 { return s.TxDirect.Load() }),
		s(&txPaths, "queued", func(s *qp.Stats) uint64 { return s.TxQueued.Load() }),
		s(&txPaths, "gso", func(s *qp.Stats) uint64 { return s.TxGSO.Load() }),
		s(&txPaths, "parked", func(s *qp.Stats) uint64 { return s.TxParked.Load() }),
		s(&txPaths, "errors", func(s *qp.Stats) uint64 { return s.TxErrors.Load() }),
		s(&impaired, "out", func(s *qp.Stats) uint64 { return s.TxImpaired.Load() }),
		s(&impaired, "in", func(s *qp.Stats) uint64 { return s.RxImpaired.Load() }),
		s(&withheld, "", func(s *qp.Stats) uint64 { return s.TxRepliesWithheld.Load() }),
		s(&eventsLost, "local", func(s *qp.Stats) uint64 { return s.EventsLost.Load() }),
		s(&eventsLost, "remote", func(s *qp.Stats) uint64 { return s.RemoteEventsDropped.Load() }),
		s(&cqDropped, "", func(s *qp.Stats) uint64 { return s.CQDropped.Load() }),
		s(&srqRecouped, "", func(s *qp.Stats) uint64 { return s.SRQRecouped.Load() }),

		{fam: &wrInProgress, gauge: true, get: func(sn *snapshot) uint64 { return uint64(sn.inProgress) }},
		{fam: &validityRanges, gauge: true, get: func(sn *snapshot) uint64 { return uint64(sn.d.ValidityRanges()) }},
		{fam: &rdPeersNow, gauge: true, get: func(sn *snapshot) uint64 { return uint64(sn.lv.RDPeers) }},
		{fam: &rcConnsNow, gauge: true, get: func(sn *snapshot) uint64 { return uint64(sn.lv.RCConnections) }},
		{fam: &srqReceives, gauge: true, get: func(sn *snapshot) uint64 { return uint64(sn.lv.SRQReceives) }},
		{fam: &srqCapacity, gauge: true, get: func(sn *snapshot) uint64 { return uint64(sn.lv.SRQCapacity) }},
		{fam: &srqHeld, gauge: true, get: func(sn *snapshot) uint64 { return uint64(sn.lv.SRQHeld) }},
	}
	for i, name := range statusLabel {
		t = append(t, s(&completions, name, func(s *qp.Stats) uint64 { return s.Completions[i].Load() }))
	}
	for i, name := range eventLabel {
		if name != "" {
			t = append(t, s(&events, name, func(s *qp.Stats) uint64 { return s.Events[i].Load() }))
		}
	}
	return t
}()
