package perf

import (
	"fmt"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/qp"
)

// BenchmarkLatency runs ping-pongs of b.N round trips and reports the
// median and mean half round trip (µs). Each UD case runs beside its
// plain-UDP baseline so benchstat can put them side by side.
func BenchmarkLatency(b *testing.B) {
	for _, qps := range []int{1, 2} {
		for _, poll := range []qp.PollMode{qp.PollBusy, qp.PollEvent} {
			for _, size := range []int{64, 1024} {
				for _, mode := range []Mode{ModeRawUDP, ModeRawUDPUnconnected, ModeUDSend} {
					name := fmt.Sprintf("qps=%d/poll=%s/size=%d/mode=%s", qps, poll, size, mode)
					b.Run(name, func(b *testing.B) {
						r, err := Run(Config{Mode: mode, Test: TestLat, Poll: poll, Size: size, Iters: b.N, Warmup: 1000, QPs: qps})
						if err != nil {
							b.Fatal(err)
						}
						b.ReportMetric(r.Median, "p50-µs")
						b.ReportMetric(r.Avg, "avg-µs")
						b.ReportMetric(r.P99, "p99-µs")
						b.ReportMetric(0, "ns/op")
					})
				}
			}
		}
	}
}

// BenchmarkBandwidth blasts 64000-byte messages for one second per round
// and reports receiver goodput.
func BenchmarkBandwidth(b *testing.B) {
	for _, qps := range []int{1, 2} {
		for _, mc := range []struct {
			mode  Mode
			noCRC bool
		}{{ModeRawUDP, false}, {ModeUDSend, false}, {ModeUDSend, true}} {
			mode := mc.mode
			if mc.noCRC {
				mode += "-nocrc"
			}
			b.Run(fmt.Sprintf("qps=%d/size=64000/mode=%s", qps, mode), func(b *testing.B) {
				var gbps, lost float64
				for range b.N {
					r, err := Run(Config{Mode: mc.mode, Test: TestBW, Size: 64000, Duration: time.Second, QPs: qps, NoCRC: mc.noCRC})
					if err != nil {
						b.Fatal(err)
					}
					gbps += r.Gbps
					if r.Sent > 0 {
						lost += float64(r.Lost) / float64(r.Sent)
					}
				}
				b.ReportMetric(gbps/float64(b.N), "Gb/s")
				b.ReportMetric(100*lost/float64(b.N), "lost-%")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// BenchmarkWriteRecord compares Write-Record with UD Send/Recv: latency
// at 64 B and 1 KiB (busy polling), and goodput of 512 KiB messages in
// 64000-byte segments against 64000-byte Sends.
func BenchmarkWriteRecord(b *testing.B) {
	for _, size := range []int{64, 1024} {
		for _, mode := range []Mode{ModeUDSend, ModeUDWriteRecord} {
			b.Run(fmt.Sprintf("lat/size=%d/mode=%s", size, mode), func(b *testing.B) {
				r, err := Run(Config{Mode: mode, Test: TestLat, Poll: qp.PollBusy, Size: size, Iters: b.N, Warmup: 1000})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(r.Median, "p50-µs")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
	for _, c := range []Config{
		{Mode: ModeUDSend, Test: TestBW, Size: 64000},
		{Mode: ModeUDWriteRecord, Test: TestBW, Size: 512 << 10, Segment: 64000},
	} {
		b.Run(fmt.Sprintf("bw/size=%d/mode=%s", c.Size, c.Mode), func(b *testing.B) { reportGoodput(b, c) })
	}
}

// BenchmarkWriteRecordLoss sends 512 KiB messages (9 segments of 64000 B)
// through 1 % and 5 % segment loss, paced below the receiver's capacity,
// and reports the fraction of bytes sent that were recorded valid with
// deliver-partial, beside the fraction that whole-message delivery keeps
// (the complete messages of the same run).
func BenchmarkWriteRecordLoss(b *testing.B) {
	for _, loss := range []float64{0.01, 0.05} {
		b.Run(fmt.Sprintf("loss=%g", loss), func(b *testing.B) {
			var partial, whole float64
			for i := range b.N {
				r, err := Run(Config{Mode: ModeUDWriteRecord, Test: TestBW, Size: 512 << 10, Segment: 64000, Loss: loss, Seed: uint64(i + 1),
					Partial: true, Deadline: 5 * time.Millisecond, Interval: 500 * time.Microsecond, Duration: time.Second})
				if err != nil {
					b.Fatal(err)
				}
				partial += float64(r.ValidBytes) / float64(r.SentBytes)
				whole += float64(r.WholeBytes) / float64(r.SentBytes)
			}
			b.ReportMetric(100*partial/float64(b.N), "partial-valid-%")
			b.ReportMetric(100*whole/float64(b.N), "whole-valid-%")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkRD compares RD with UD in one run: Send/Recv ping-pong and
// RDMA Write (post to acknowledged) latency at 64 B and 1 KiB against UD
// Send/Recv (busy polling); RDMA Write goodput of 512 KiB messages
// against UD Write-Record's, and RD Send goodput against UD Send's; and
// RD goodput at 1 % and 5 % loss applied both ways.
func BenchmarkRD(b *testing.B) {
	for _, size := range []int{64, 1024} {
		for _, mode := range []Mode{ModeUDSend, ModeRDSend, ModeRDWrite} {
			b.Run(fmt.Sprintf("lat/size=%d/mode=%s", size, mode), func(b *testing.B) {
				r, err := Run(Config{Mode: mode, Test: TestLat, Poll: qp.PollBusy, Size: size, Iters: b.N, Warmup: 1000})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(r.Median, "p50-µs")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
	for _, c := range []Config{
		{Mode: ModeUDWriteRecord, Test: TestBW, Size: 512 << 10, Segment: 64000},
		{Mode: ModeRDWrite, Test: TestBW, Size: 512 << 10},
		{Mode: ModeUDSend, Test: TestBW, Size: 64000},
		{Mode: ModeRDSend, Test: TestBW, Size: 64000},
		{Mode: ModeRDWrite, Test: TestBW, Size: 512 << 10, Loss: 0.01, Seed: 1},
		{Mode: ModeRDWrite, Test: TestBW, Size: 512 << 10, Loss: 0.05, Seed: 1},
	} {
		b.Run(fmt.Sprintf("bw/size=%d/mode=%s/loss=%g", c.Size, c.Mode, c.Loss), func(b *testing.B) { reportGoodput(b, c) })
	}
}

// BenchmarkRDSizes is RD Send/Recv ping-pong at the sizes libfabric's
// fi_pingpong over "udp;ofi_rxd" was measured at (experiments/rd-vs-rxd.sh
// runs both).
func BenchmarkRDSizes(b *testing.B) {
	for _, size := range []int{64, 1024, 8192, 32768, 64000} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			r, err := Run(Config{Mode: ModeRDSend, Test: TestLat, Poll: qp.PollBusy, Size: size, Iters: b.N, Warmup: min(1000, b.N)})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(r.Median, "p50-µs")
			b.ReportMetric(r.Avg, "avg-µs")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkRC compares RC (iWARP over TCP and MPA) with plain Go TCP in
// one run: half round trips at 64 B and 1 KiB with busy polling (rc-send
// ping-pong; rc-write posted until the peer's TCP acknowledged it; rc-read
// round trip), and goodput of 64 KiB and 512 KiB messages, busy-polled
// too (issue 6: the plain-TCP baseline is the busy-polled one).
func BenchmarkRC(b *testing.B) {
	for _, size := range []int{64, 1024} {
		for _, mode := range []Mode{ModeRawTCP, ModeRCSend, ModeRCWrite, ModeRCRead} {
			b.Run(fmt.Sprintf("lat/size=%d/mode=%s", size, mode), func(b *testing.B) {
				r, err := Run(Config{Mode: mode, Test: TestLat, Poll: qp.PollBusy, Size: size, Iters: b.N, Warmup: min(1000, b.N)})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(r.Median, "p50-µs")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
	for _, size := range []int{64 << 10, 512 << 10} {
		for _, mode := range []Mode{ModeRawTCP, ModeRCSend, ModeRCWrite, ModeRCRead} {
			b.Run(fmt.Sprintf("bw/size=%d/mode=%s", size, mode), func(b *testing.B) {
				reportGoodput(b, Config{Mode: mode, Test: TestBW, Poll: qp.PollBusy, Size: size})
			})
		}
	}
}

// reportGoodput runs c for one second, b.N times but at most three (use
// -benchtime 1x), and reports the mean goodput.
func reportGoodput(b *testing.B, c Config) {
	runs := min(b.N, 3)
	var gbps float64
	for range runs {
		c.Duration = time.Second
		r, err := Run(c)
		if err != nil {
			b.Fatal(err)
		}
		gbps += r.Gbps
	}
	b.ReportMetric(gbps/float64(runs), "Gb/s")
	b.ReportMetric(0, "ns/op")
}
