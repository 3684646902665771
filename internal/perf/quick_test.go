package perf
import ("testing";"fmt";"github.com/udiwarp/udiwarp/qp")
func TestQuick(t *testing.T) {
	for _, c := range []Config{
		{Mode: ModeRawUDP, Test: TestLat, Poll: qp.PollBusy, Size: 64},
		{Mode: ModeUDSend, Test: TestLat, Poll: qp.PollBusy, Size: 64},
		{Mode: ModeRawUDP, Test: TestLat, Poll: qp.PollEvent, Size: 64, Iters: 3000},
		{Mode: ModeUDSend, Test: TestLat, Poll: qp.PollEvent, Size: 64, Iters: 3000},
		{Mode: ModeRawUDP, Test: TestBW, Size: 64000},
		{Mode: ModeUDSend, Test: TestBW, Size: 64000},
	} {
		r, err := Run(c)
		fmt.Printf("%s %s %s: med %.2f avg %.2f p99 %.2f | %.1f Gb/s sent %d recv %d err %v\n", c.Mode, c.Test, c.Poll, r.Median, r.Avg, r.P99, r.Gbps, r.Sent, r.Received, err)
	}
}
