// Package metrics exposes the counters of udiwarp devices to Prometheus,
// named by its conventions (udiwarp_..._total, _bytes): datagrams and
// bytes in and out, drops by reason, retransmissions, completions by
// status, Write-Record messages by outcome, validity-map ranges and
// messages in progress. The counters are read when Prometheus scrapes;
// nothing is added to the data path.
package metrics

import (
	"net/http"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/udiwarp/udiwarp/qp"
)

// Collector reads the stats of every device added to it. Devices that
// close keep their last counts, so a run's totals survive it: their
// counters are folded into a running sum and the device itself is let go
// (at the next Add or scrape), so a long-lived process that opens a
// device per run holds only its open ones.
type Collector struct {
	mu      sync.Mutex
	devs    []*qp.Device
	retired counts // the final counts of devices that closed

	datagrams, bytes, drops, retrans, completions, wr *prometheus.Desc
	ranges, inProgress, peers                         *prometheus.Desc
	wrSegDrops, withheld, eventsDropped, probes       *prometheus.Desc
	impaired                                          *prometheus.Desc
}

// New returns an empty Collector.
func New() *Collector {
	return &Collector{
		datagrams:   prometheus.NewDesc("udiwarp_datagrams_total", "UDP datagrams, by direction.", []string{"direction"}, nil),
		bytes:       prometheus.NewDesc("udiwarp_transferred_bytes_total", "Bytes on the wire (UDP payloads, TCP stream octets), by direction.", []string{"direction"}, nil),
		drops:       prometheus.NewDesc("udiwarp_dropped_total", "Received datagrams dropped, by reason.", []string{"reason"}, nil),
		retrans:     prometheus.NewDesc("udiwarp_retransmissions_total", "RD Data frames sent again.", nil, nil),
		completions: prometheus.NewDesc("udiwarp_completions_total", "Work completions, by status.", []string{"status"}, nil),
		wr:          prometheus.NewDesc("udiwarp_write_record_messages_total", "Write-Record messages at targets, by outcome.", []string{"outcome"}, nil),
		ranges:      prometheus.NewDesc("udiwarp_validity_map_ranges", "Disjoint valid ranges in the regions' validity maps.", nil, nil),
		inProgress:  prometheus.NewDesc("udiwarp_write_record_in_progress", "Write-Record messages in progress at targets.", nil, nil),
		peers:       prometheus.NewDesc("udiwarp_rd_peers_created_total", "RD peer states created.", nil, nil),
		wrSegDrops: prometheus.NewDesc("udiwarp_write_record_segments_dropped_total",
			"Write-Record segments the target's engine dropped, by reason (docs/wire.md §4.3).", []string{"reason"}, nil),
		withheld: prometheus.NewDesc("udiwarp_replies_withheld_total",
			"Error messages and RD Challenges not sent: larger than what drew them, or drawn by a multicast or broadcast datagram.", nil, nil),
		eventsDropped: prometheus.NewDesc("udiwarp_async_events_dropped_total",
			"Asynchronous events not queued, by origin: the device's own (Events full) or a peer's (coalesced or over their share).", []string{"origin"}, nil),
		probes: prometheus.NewDesc("udiwarp_rd_window_probes_total", "RD frames sent into a peer's zero window to probe it.", nil, nil),
		impaired: prometheus.NewDesc("udiwarp_impaired_datagrams_total",
			"Datagrams the software impairment layer dropped, corrupted, duplicated, reordered or delayed, by direction (qp.DeviceConfig Impair and ImpairRx; udperf -loss).", []string{"direction"}, nil),
	}
}

// Add makes the collector report d.
func (c *Collector) Add(d *qp.Device) {
	c.mu.Lock()
	c.retireLocked()
	c.devs = append(c.devs, d)
	c.mu.Unlock()
}

// retireLocked folds the counts of the devices that closed into retired
// and forgets them.
func (c *Collector) retireLocked() {
	open := c.devs[:0]
	for _, d := range c.devs {
		if d.Closed() {
			if c.retired == nil {
				c.retired = counts{}
			}
			c.retired.add(d)
			continue
		}
		open = append(open, d)
	}
	clear(c.devs[len(open):])
	c.devs = open
}

// Devices says how many devices the collector holds (open ones, and any
// closed since the last Add or scrape).
func (c *Collector) Devices() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.devs)
}

// counts are summed counters by key ("rx", "drop/crc", "completion/3",
// ...), and the two gauges under "gauge/...".
type counts map[string]float64

// add adds d's counters (and gauges) to k.
func (k counts) add(d *qp.Device) {
	add := func(key string, v uint64) { k[key] += float64(v) }
	s := d.Stats()
	add("rx", s.RxDatagrams.Load())
	add("tx", s.TxDatagrams.Load())
	add("rxb", s.RxBytes.Load())
	add("txb", s.TxBytes.Load())
	add("drop/crc", s.RxBadCRC.Load())
	add("drop/bad_stag", s.RxBadSTag.Load()+s.RxAccess.Load())
	add("drop/bounds", s.RxBounds.Load())
	add("drop/no_recv", s.RxNoRecv.Load()+s.RxSRQOverdraft.Load())
	add("drop/state_cap", s.RDRefused.Load())
	add("drop/unknown_qp", s.RxUnknownQP.Load())
	add("drop/malformed", s.RxTruncated.Load()+s.RxTooLong.Load()+s.RxBadVersion.Load()+s.RxBadHeader.Load()+s.RxBadOpcode.Load())
	add("drop/unvalidated", s.RDRejected.Load())
	add("drop/stale", s.RxWRStale.Load())
	add("drop/over_budget", s.RDOverBudget.Load())
	add("drop/address_limit", s.RDAddrLimited.Load())
	add("withheld", s.TxRepliesWithheld.Load())
	add("events/local", s.EventsLost.Load())
	add("events/remote", s.RemoteEventsDropped.Load())
	add("probes", s.RDWindowProbes.Load())
	add("impaired/out", s.TxImpaired.Load())
	add("impaired/in", s.RxImpaired.Load())
	add("retrans", s.RDRetransmits.Load())
	add("peers", s.RDPeers.Load())
	for i := range s.Completions {
		add(completionKey(i), s.Completions[i].Load())
	}
	wr, n := d.WriteRecordStats()
	add("wr/completed", wr.Completed)
	add("wr/partial", wr.Partial)
	add("wr/discarded", wr.Expired)
	add("wr/superseded", wr.Superseded)
	add("wr/evicted", wr.Evicted)
	add("wr/displaced", wr.Displaced)
	add("wr/fragmented", wr.Fragmented)
	add("wrseg/stale", wr.Stale)
	add("wrseg/duplicate", wr.Duplicate)
	add("wrseg/far_ahead", wr.FarAhead)
	add("wrseg/mismatch", wr.Mismatch)
	if !d.Closed() { // a closed device holds nothing in progress
		add("gauge/in_progress", uint64(n))
		add("gauge/ranges", uint64(d.ValidityRanges()))
	}
}

func completionKey(i int) string { return "completion/" + strconv.Itoa(i) }

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.datagrams, c.bytes, c.drops, c.retrans, c.completions, c.wr, c.ranges, c.inProgress, c.peers,
		c.wrSegDrops, c.withheld, c.eventsDropped, c.probes, c.impaired} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	c.retireLocked()
	sum := counts{}
	for k, v := range c.retired {
		sum[k] = v
	}
	devs := append([]*qp.Device(nil), c.devs...)
	c.mu.Unlock()
	for _, d := range devs {
		sum.add(d)
	}
	var completions [len(qp.Stats{}.Completions)]float64
	for i := range completions {
		completions[i] = sum[completionKey(i)]
	}
	ranges, inProgress := sum["gauge/ranges"], sum["gauge/in_progress"]
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	counter(c.datagrams, sum["rx"], "in")
	counter(c.datagrams, sum["tx"], "out")
	counter(c.bytes, sum["rxb"], "in")
	counter(c.bytes, sum["txb"], "out")
	for _, r := range []string{"crc", "bad_stag", "bounds", "no_recv", "state_cap", "unknown_qp", "malformed", "unvalidated", "stale",
		"over_budget", "address_limit"} {
		counter(c.drops, sum["drop/"+r], r)
	}
	counter(c.retrans, sum["retrans"])
	counter(c.peers, sum["peers"])
	for i, v := range completions {
		if v > 0 || i == 0 {
			counter(c.completions, v, qp.Status(i).String())
		}
	}
	for _, o := range []string{"completed", "partial", "discarded", "superseded", "evicted", "displaced", "fragmented"} {
		counter(c.wr, sum["wr/"+o], o)
	}
	for _, r := range []string{"stale", "duplicate", "far_ahead", "mismatch"} {
		counter(c.wrSegDrops, sum["wrseg/"+r], r)
	}
	counter(c.withheld, sum["withheld"])
	counter(c.eventsDropped, sum["events/local"], "local")
	counter(c.eventsDropped, sum["events/remote"], "remote")
	counter(c.probes, sum["probes"])
	counter(c.impaired, sum["impaired/in"], "in")
	counter(c.impaired, sum["impaired/out"], "out")
	ch <- prometheus.MustNewConstMetric(c.ranges, prometheus.GaugeValue, ranges)
	ch <- prometheus.MustNewConstMetric(c.inProgress, prometheus.GaugeValue, inProgress)
}

// Handler serves the collector's metrics (and the Go runtime's) at /metrics.
func (c *Collector) Handler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, collectors.NewGoCollector())
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}
