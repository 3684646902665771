package qp

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// tcpKernelBytes reads the kernel's TCP memory from /proc/net/sockstat
// (pages in use by TCP sockets' buffers).
func tcpKernelBytes() int64 {
	b, err := os.ReadFile("/proc/net/sockstat")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "TCP:" {
			for i := 1; i+1 < len(f); i += 2 {
				if f[i] == "mem" {
					n, _ := strconv.ParseInt(f[i+1], 10, 64)
					return n * int64(os.Getpagesize())
				}
			}
		}
	}
	return -1
}

// tcpSlabBytes returns the size of the kernel's TCP socket object
// (/proc/slabinfo), or 0.
func tcpSlabBytes() int64 {
	b, err := os.ReadFile("/proc/slabinfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 3 && f[0] == "TCP" {
			n, _ := strconv.ParseInt(f[3], 10, 64)
			return n
		}
	}
	return 0
}

// BenchmarkRCConnectionMemory reports what one RC connection costs, both
// ends together: Go heap (two QPs with default capacities, 256 send and
// 256 receive WRs each, the connection state and receive buffers), and in
// the kernel two TCP socket objects plus the TCP buffer memory still in
// use, for 1, 100 and 1000 connections, each having carried one 64 KiB
// Send each way.
func BenchmarkRCConnectionMemory(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("conns=%d", n), func(b *testing.B) {
			for b.Loop() {
				a, s := newRCSide(b, DeviceConfig{}), newRCSide(b, DeviceConfig{})
				l, err := s.dev.ListenRC("127.0.0.1:0")
				if err != nil {
					b.Fatal(err)
				}
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				k0 := tcpKernelBytes()
				type pair struct{ a, s *QP }
				pairs := make([]pair, n)
				for i := range n {
					qa, qs := a.defaultQP(b), s.defaultQP(b)
					done := make(chan error, 1)
					go func() {
						r, err := l.Next(context.Background())
						if err == nil {
							err = r.Accept(qs, RCConfig{})
						}
						done <- err
					}()
					if _, err := qa.Connect(context.Background(), l.Addr().String(), RCConfig{}); err != nil {
						b.Fatal(err)
					}
					if err := <-done; err != nil {
						b.Fatal(err)
					}
					qs.PostRecv(&RecvWR{SGL: []SGE{s.mr.SGE(0, 65536)}})
					qa.PostRecv(&RecvWR{SGL: []SGE{a.mr.SGE(0, 65536)}})
					qa.PostSend(&SendWR{SGL: []SGE{a.mr.SGE(65536, 65536)}})
					qs.PostSend(&SendWR{SGL: []SGE{s.mr.SGE(65536, 65536)}})
					pairs[i] = pair{qa, qs}
				}
				for _, cq := range []*CQ{a.cq, s.cq} { // every message arrived: the buffers are in use
					wcs := make([]WorkCompletion, 64)
					for got, end := 0, time.Now().Add(30*time.Second); got < n; {
						k := cq.Poll(wcs)
						got += k
						if k == 0 {
							if time.Now().After(end) {
								b.Fatalf("%d of %d messages", got, n)
							}
							time.Sleep(100 * time.Microsecond)
						}
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				k1 := tcpKernelBytes()
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "heap-bytes/conn")
				b.ReportMetric(float64(2*tcpSlabBytes())+float64(k1-k0)/float64(n), "kernel-bytes/conn")
				l.Close()
				runtime.KeepAlive(pairs)
			}
		})
	}
}

func (s *rcSide) defaultQP(t testing.TB) *QP {
	q, err := s.pd.CreateQP(QPAttr{Type: RC, SendCQ: s.cq, RecvCQ: s.cq})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Modify(ModifyAttr{State: StateInit}); err != nil {
		t.Fatal(err)
	}
	return q
}
