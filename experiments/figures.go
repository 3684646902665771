package main

import (
	"bytes"
	"strconv"
)

// A figure is a set of series measured over the same x values: message
// sizes (lossless, on loopback, `udperf local`) or loss rates (the
// kernel's or the impairment layer's, `udperf client` against `udperf
// server` in another namespace, or `udperf local -loss`).
type figure struct {
	ID, Title string
	Test      string // lat or bw
	XLabel    string
	YLabel    string
	X         []float64 // bytes, or loss in percent
	LossX     bool      // X are loss rates; Size is the message size
	Size      int
	Series    []series
	// Panels cut a size figure into small, medium and large plots (FIG 15).
	Panels [][2]float64
	// LogY draws the y axis on a log scale (latencies over sizes that span
	// decades, in one plot); memory per peer always is.
	LogY bool
	// Seed is what seed 003 published for it, and Differs why ours may
	// not look the same, for the report.
	Seed, Differs string
	// External figures are made by a program of their own (FIG 19).
	External func(e *env, f *figure, o options) ([]row, error)
	// Plot and Table, where set, draw the figure and write its report
	// table instead of the generic ones (SIPp: several values per run);
	// Needs says what the figure needs when it was not made.
	Plot  func(dir string, f *figure, rows []row) ([]plotted, error)
	Table func(b *bytes.Buffer, f *figure, rows []row)
	Needs string
}

// A series is one line of a figure: a udperf mode with its flags.
type series struct {
	Label string
	Mode  string
	Flags []string
	// MaxSize: above it the series is measured in chunks of MaxSize, as
	// the seed's UD Send for messages over 64 KB (the application
	// segments), and the row says so; 0: no limit.
	MaxSize int
}

// udSendMax is the largest UD Send udperf carries over IPv4 in one
// datagram, rounded down to a round size (65,485 exactly).
const udSendMax = 65000

func lossRates(quick bool) []float64 {
	if quick {
		return []float64{0, 1, 5}
	}
	return []float64{0, 0.1, 0.5, 1, 2, 5}
}

func sizes(from, to int, quick bool, quickSet ...int) []float64 {
	if quick {
		var x []float64
		for _, s := range quickSet {
			x = append(x, float64(s))
		}
		return x
	}
	var x []float64
	for s := from; s <= to; s *= 4 {
		x = append(x, float64(s))
	}
	return x
}

func figures(quick bool) []*figure {
	loss := lossRates(quick)
	partial := []string{"-partial", "-deadline", "5ms"}
	return []*figure{
		{
			ID: "fig15", Title: "Verbs latency (seed 003 FIG 15)", Test: "lat",
			XLabel: "message size (bytes)", YLabel: "latency, half round trip (µs)",
			X: sizes(2, 8<<20, quick, 64, 1024, 4096, 32768, 1<<20, 4<<20), // quick: two in each panel
			Series: []series{
				{Label: "UD Send/Recv", Mode: "ud-send", MaxSize: udSendMax},
				{Label: "UD Write-Record", Mode: "ud-wr"},
				{Label: "RC Send/Recv", Mode: "rc-send"},
				{Label: "RC RDMA Write", Mode: "rc-write"},
			},
			Panels: [][2]float64{{0, 2048}, {2048, 65536}, {65536, 1 << 30}},
			Seed: "UD Send/Recv and UD Write-Record 27-28 µs under 128 B, RC about 33 µs; up to 2 KB UD Send/Recv 18.1 % below RC Send/Recv " +
				"and UD Write-Record 24.4 % below RC RDMA Write (two hosts, 10 GbE NetEffect cards, software iWARP).",
			Differs: "Ours is one host's loopback: no NIC, no wire, and both ends share two cores, so absolute times are a few µs and " +
				"what remains is the software path; RC and UD differ by little under 2 KB. UD Send above 65,000 bytes is not one datagram " +
				"and is not measured for latency. From 16 KiB to 256 KiB RC is 1.4-2.2x raw TCP's latency (udperf compare): MPA's " +
				"CRC32c over every byte at both ends and the copy of each FPDU out of the TCP stream into place are per-byte costs raw " +
				"TCP does not pay (RC Send of 64 KiB without the CRC, udperf -nocrc, is 1.33x instead of 1.54x); from 1 MiB RC is " +
				"below raw TCP, whose ping-pong of megabyte writes is slow on this host. RC's megabyte latencies before 27 November " +
				"2026 (RC Write 13 ms for 2 MiB) measured a defect of our RC, since fixed (BENCHMARKS.md, issue 32), not the cost " +
				"of connections.",
		},
		{
			ID: "fig16", Title: "Unidirectional verbs bandwidth (seed 003 FIG 16)", Test: "bw",
			XLabel: "message size (bytes)", YLabel: "goodput (Gb/s)",
			X: sizes(1024, 8<<20, quick, 4096, 1<<20),
			Series: []series{
				{Label: "UD Send/Recv (64 KB chunks above)", Mode: "ud-send", MaxSize: udSendMax},
				{Label: "UD Write-Record", Mode: "ud-wr"},
				{Label: "RC Send/Recv", Mode: "rc-send"},
				{Label: "RC RDMA Write", Mode: "rc-write"},
			},
			Seed: "UD Send/Recv up to 33.4 % above RC Send/Recv (at 256 KB); UD Write-Record 256 % above RC RDMA Write at 512 KB.",
			Differs: "Both ends share one host's two cores and its loopback, with no NIC and no wire: what is measured is the software " +
				"path. RC pays MPA's CRC32c over every byte at both ends, most of what separates it from raw TCP on two cores (without " +
				"it, udperf -nocrc, RC moves as much as raw TCP from 1 MiB), and copies every FPDU out of the TCP byte stream into " +
				"place, Send and Write alike (UD Send and Write-Record land in place); RC Send/Recv also waits for receive credits, as " +
				"RC has no receiver-not-ready. The seed's TCP cost was a 10 GbE link's and a 2010 kernel's.",
		},
		{
			ID: "fig17", Title: "UD Send/Recv bandwidth under packet loss (seed 003 FIG 17)", Test: "bw",
			XLabel: "packet loss (%)", YLabel: "goodput (Gb/s)", X: loss, LossX: true,
			Series: func() []series {
				var s []series
				for _, n := range []int{1400, 8192, 32768, udSendMax} {
					if quick && n != 1400 && n != udSendMax {
						continue
					}
					s = append(s, series{Label: "UD Send " + strconv.Itoa(n) + " B", Mode: "ud-send", Flags: []string{"-s", strconv.Itoa(n)}})
				}
				return s
			}(),
			Seed: "The larger the message, the more a little loss costs: a message is lost with any of its packets (0.1 % is intra-US web " +
				"traffic, 0.5 % Europe-US, 1-5 % Africa and parts of Asia).",
			Differs: "The same shape is expected: a datagram over the 1,500-byte MTU of the veth is IP fragments, and it is lost with any of them.",
		},
		{
			ID: "fig18", Title: "UD Write-Record with partial delivery under packet loss, by segment size (seed 003 FIG 18)", Test: "bw",
			XLabel: "packet loss (%)", YLabel: "valid goodput (Gb/s)", X: loss, LossX: true, Size: 512 << 10,
			Series: func() []series {
				var s []series
				for _, seg := range []int{1400, 9000, 64000} {
					s = append(s, series{Label: "Write-Record, " + strconv.Itoa(seg) + " B segments", Mode: "ud-wr",
						Flags: append([]string{"-mtu", strconv.Itoa(seg)}, partial...)})
				}
				return s
			}(),
			Seed: "Partial delivery keeps what arrived, so Write-Record degrades gracefully where Send/Recv loses whole messages; the " +
				"seed concludes a segment size (MTU) suited to the loss rate is best.",
			Differs: "The veth's MTU is 1,500 bytes: a 9,000 or 64,000-byte segment is IP fragments that must all arrive, so it is " +
				"lost more often as loss grows, while 1,400-byte segments are single packets and go out with UDP GSO, many in one " +
				"system call, which the kernel does not do for datagrams over the MTU. On this host the smallest segment wins at every " +
				"loss rate; with jumbo frames, as the seed's 10 GbE link may have had, a 9,000-byte segment would be one packet.",
		},
		{
			ID: "fig-rdma-loss", Title: "RDMA Write under packet loss: RC (TCP + MPA), RD, and UD Write-Record", Test: "bw",
			XLabel: "packet loss (%)", YLabel: "goodput (Gb/s)", X: loss, LossX: true, Size: 512 << 10,
			Series: []series{
				{Label: "RC RDMA Write", Mode: "rc-write"},
				// RD's segment fits the 1,500-byte MTU: a 64 KB datagram is 45
				// fragments, all of which a retransmission needs again.
				{Label: "RD RDMA Write (1400 B segments)", Mode: "rd-write", Flags: []string{"-mtu", "1400"}},
				{Label: "UD Write-Record (partial, 1400 B segments)", Mode: "ud-wr", Flags: append([]string{"-mtu", "1400"}, partial...)},
			},
			Seed: "Not in the seed: its loss study covers UD Send/Recv and Write-Record. RC is the reliable baseline, RD our light " +
				"reliability layer over UDP.",
			Differs: "TCP's congestion control (CUBIC) backs off at every loss; RD retransmits selectively under its own congestion " +
				"control (BBR, which takes a loss while the RTT is at its minimum for random and keeps its rate: docs/verbs.md); Write-Record " +
				"retransmits nothing and counts only the bytes that arrived.",
		},
		{
			ID: "fig19", Title: "Initial buffering of a media stream (seed 003 FIG 19, udstream)", Test: "stream",
			XLabel: "packet loss (%)", YLabel: "initial buffering (ms)", LossX: true,
			Seed:     "UD streaming buffered 74.1 % faster than VLC's HTTP streaming over RC-iWARP; the socket interface cost about 2 %.",
			Differs:  fig19Differs(quick),
			External: udstreamFigure,
		},
		{
			ID: "fig-shim", Title: "The socket interface's cost: pre-buffering through the shim and through kernel sockets", Test: "stream",
			XLabel: "stream bit rate (Mb/s)", YLabel: "pre-buffering, sent as fast as taken (ms)",
			Seed: "About 2 % more pre-buffering time through the datagram-iWARP socket interface than without it.",
			Differs: "The seed timed the pre-buffering of a paced stream, where a cost paid once at the start vanishes in the " +
				"stream's own 500 ms; here the stream is sent as fast as it is taken, so pre-buffering is milliseconds and any cost " +
				"paid once stands out: udstream counts from the receiver's start, which for send-ud opens a udiwarp device and QP " +
				"(for udp, a socket). A gap that stays the same in ms as the bit rate grows is that start-up cost; one that grows " +
				"with it would be a per-datagram cost. The paced comparison is fig19's.",
			External: shimFigure,
		},
		{
			ID: "sipp", Title: "SIPp basic call: memory and response time per client (seed 003 FIG 20)", Test: "sipp",
			XLabel: "clients (calls open at once, a socket each)", YLabel: "memory: both SIPp processes' RSS + socket slab (MiB)",
			Seed: "A SIPp UAS and UAC in SipStone's basic call test, a UDP port per client: at 10,000 clients datagram-iWARP used 24.1 % " +
				"less memory than RC-iWARP (both SIPp processes plus the slab of their sockets; 28.1 % predicted from socket sizes " +
				"alone), and under light load its response time was 43.1 % below RC-iWARP's.",
			Differs: "Both SIPp processes share one host's two cores and its loopback, so a response takes a fraction of a " +
				"millisecond, and SIPp's own response-time statistic (INVITE to 200 OK) counts whole milliseconds: the response " +
				"time here is each call's BYE to its 200 OK, at µs, from SIPp's own message trace, which over TCP does not log the " +
				"INVITE. The clients open at 1,000 calls a second and hang up at that rate, so this is not the seed's light load. " +
				"The seed's own comparison, datagram-iWARP against RC-iWARP through the same socket interface, is preload-ud " +
				"(and -rd) against preload-rc, SIPp's TCP over RC QPs (UDIWARP_PRELOAD_TCP=rc); kernel TCP is the plain baseline. " +
				"The preload runs each socket over a QP on the program's own kernel socket, so its memory is the kernel's socket " +
				"plus the engine's (about 10 KiB a UDP socket, about 30 KiB an RC connection with its receives): the seed's " +
				"datagram-iWARP replaced the socket stack, ours sits on top of it. Over RC, connect waits for the MPA exchange " +
				"(an INVITE is logged, and timed, from then), where the kernel's TCP connect returns at once.",
			External: sippFigure, Plot: sippPlot, Table: sippTable, Needs: "needs sipp (Debian package sip-tester)",
		},
		{
			ID: "fig-memory", Title: "Memory per peer as peers grow: one RD or UD QP serving every client, RC a QP per connection", Test: "memory",
			XLabel: "peers (clients at distinct addresses)", YLabel: "server's RSS + socket slab per peer (bytes)",
			Seed: "Connection-oriented iWARP pays socket buffers, connection state and receive buffers for every peer, so memory grows " +
				"with the number of clients; datagram-iWARP serves them all from one QP (its SIPp run: 24.1 % less memory at 10,000 " +
				"clients, and a gap expected to matter at hundreds of thousands to millions).",
			Differs: "This is the verbs level, without SIPp: the server is a child process serving one QP (RD or UD) or a QP per RC " +
				"connection, and the figure is its whole resident set plus the kernel's socket slab, per peer. Its fixed part (the Go " +
				"runtime) spreads thinner as peers grow, so a small count reads high. UD keeps no state per peer: its line is that " +
				"spread and the replies' garbage. RC stops at 10,000 connections: the descriptors a process may hold here stop it.",
			External: memoryFigure, Needs: "needs root (the kernel's slab)",
		},
		{
			ID: "bottleneck", Title: "RD through a real bottleneck: alone, beside TCP, beside RD, 100 peers (issue 31 §4)", Test: "bottleneck",
			XLabel: "time (s)", YLabel: "goodput (Gb/s)",
			Seed: "Not in the seed. Issue 31's targets: RD alone through 1 Gbit/s >= 0.9 Gbit/s with the bottleneck's drops <= 2 % " +
				"of what RD sent; beside an iperf3 TCP flow for 20 s each gets a third to two thirds (ratio 0.5x to 2x); two RD flows " +
				"Jain's index >= 0.95 after 5 s; 100 RD peers keep >= 0.8x of the bottleneck.",
			Differs: "A tbf on a router namespace is a real queue that drops at its limit, but everything shares this host's two " +
				"cores: the senders, the router's forwarding and the receivers, so a flow may be limited by CPU before the " +
				"bottleneck. Goodput of RD is Writes completed (acknowledged by the receiver); TCP's is iperf3's receiver's count.",
			External: bottleneckFigure, Plot: bottleneckPlot, Table: bottleneckTable,
			Needs: "needs root, iproute2 with tc's tbf (and iperf3 for the TCP run)",
		},
	}
}

func figureIDs() []string {
	var ids []string
	for _, f := range figures(false) {
		ids = append(ids, f.ID)
	}
	return ids
}

func needsKernel(figs []*figure) bool {
	for _, f := range figs {
		if f.LossX && f.External == nil {
			return true
		}
	}
	return false
}

// fig19Differs says why fig19 differs from the seed, for the run that
// made it: a full run paces the stream at its own rate, a quick one sends
// it as fast as it is taken.
func fig19Differs(quick bool) string {
	if quick {
		return "This quick run sends the stream unpaced (udstream -speed 0), as fast as it is taken: initial buffering is how " +
			"soon the first 500 ms of stream time arrive, a few milliseconds, and says how fast each transport starts, not how a " +
			"viewer waits; the full run paces the stream at its own rate, where lossless buffering is the stream's 500 ms " +
			"whatever carries it and loss is where transports differ."
	}
	return "udstream paces at the stream's own rate, so lossless buffering is the stream's 500 ms whatever carries it; loss is where transports differ."
}
