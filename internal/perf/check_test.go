package perf

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/llp"
	"github.com/udiwarp/udiwarp/qp"
)

// TestCheckDefaults: the plain defaults pass for every mode and test, in
// both polling modes (rc-write lat: busy only).
func TestCheckDefaults(t *testing.T) {
	for _, m := range knownModes {
		for _, test := range []Test{TestLat, TestBW} {
			for _, poll := range []qp.PollMode{qp.PollBusy, qp.PollEvent} {
				if m == ModeRCWrite && test == TestLat && poll == qp.PollEvent {
					continue
				}
				// As udperf fills a Config from its flags' defaults.
				size, small := 64, 1
				if m.Atomic() { // udperf's -s default is 8 there; 0 is the zero value
					size, small = AtomicSize, 0
				}
				c := Config{Mode: m, Test: test, Poll: poll, Size: size, Iters: 10000, Warmup: 1000, Duration: time.Second,
					QPs: 1, Seed: 1, Deadline: 5 * time.Millisecond}
				if err := c.Check(); err != nil {
					t.Errorf("%s %s %v: %v", m, test, poll, err)
				}
				c = Config{Mode: m, Test: test, Poll: poll, Size: small}
				if err := c.Check(); err != nil {
					t.Errorf("%s %s %v, zero values: %v", m, test, poll, err)
				}
			}
		}
	}
}

// TestCheckRefuses: a setting a mode ignores, or a size it cannot carry,
// is refused in one line, and Run refuses it before it runs anything.
func TestCheckRefuses(t *testing.T) {
	lat := func(m Mode) Config { return Config{Mode: m, Test: TestLat, Poll: qp.PollBusy, Size: 64} }
	bw := func(m Mode) Config { return Config{Mode: m, Test: TestBW, Poll: qp.PollBusy, Size: 64} }
	with := func(c Config, f func(*Config)) Config { f(&c); return c }
	for _, c := range []Config{
		with(bw(ModeUDSend), func(c *Config) { c.Size = 65536 }), // used to run, lose everything and exit 0
		with(lat(ModeRawUDP), func(c *Config) { c.Size = 65508 }),
		with(lat(ModeRawTCP), func(c *Config) { c.Size = -1 }),
		lat(ModeRDAtomic), // 64 bytes: an atomic is one 8-byte word
		with(bw(ModeRCAtomic), func(c *Config) { c.Size = 16 }),
		with(bw(ModeRCWriteImm), func(c *Config) { c.Loss = 0.1 }),
		with(bw(ModeRDAtomic), func(c *Config) { c.Segment = 1000 }),
		{Mode: "nope", Test: TestLat},
		{Mode: ModeUDSend, Test: "rate"},
		with(lat(ModeUDSend), func(c *Config) { c.Poll = 7 }),
		with(bw(ModeRawUDP), func(c *Config) { c.Loss = 0.1 }),
		with(bw(ModeRawUDPUnconnected), func(c *Config) { c.Loss = 0.1 }),
		with(bw(ModeRawTCP), func(c *Config) { c.Loss = 0.1 }),
		with(bw(ModeRCSend), func(c *Config) { c.Loss = 0.1 }),
		with(bw(ModeRCWrite), func(c *Config) { c.Loss = 0.1 }),
		with(lat(ModeUDSend), func(c *Config) { c.Loss = 0.1 }),
		with(lat(ModeUDWriteRecord), func(c *Config) { c.Loss = 0.1 }),
		with(bw(ModeRDSend), func(c *Config) { c.Loss = 1 }),
		with(bw(ModeRDSend), func(c *Config) { c.Loss = -0.1 }),
		with(bw(ModeUDWriteRecord), func(c *Config) { c.QPs = 2 }),
		with(bw(ModeRDWrite), func(c *Config) { c.QPs = 2 }),
		with(lat(ModeRCSend), func(c *Config) { c.QPs = 2 }),
		with(bw(ModeUDSend), func(c *Config) { c.Partial = true }),
		with(bw(ModeRDWriteRecord), func(c *Config) { c.Partial = true }),
		with(bw(ModeUDWriteRecord), func(c *Config) { c.Deadline = -time.Second }),
		with(bw(ModeUDSend), func(c *Config) { c.Segment = 1000 }),
		with(bw(ModeRawTCP), func(c *Config) { c.Segment = 1000 }),
		with(bw(ModeUDSend), func(c *Config) { c.Interval = time.Millisecond }),
		with(lat(ModeUDWriteRecord), func(c *Config) { c.Interval = time.Millisecond }),
		with(lat(ModeUDSend), func(c *Config) { c.Bidir = true }),
		with(lat(ModeRawUDP), func(c *Config) { c.NoCRC = true }),
		with(lat(ModeRCWrite), func(c *Config) { c.Poll = qp.PollEvent }),
		with(lat(ModeRCWrite), func(c *Config) { c.Size = 0 }),
		with(lat(ModeUDSend), func(c *Config) { c.LLP = "dpdk" }),
		with(lat(ModeRawUDP), func(c *Config) { c.LLP = LLPXDP }),
		with(bw(ModeRawUDPUnconnected), func(c *Config) { c.LLP = LLPXDP }),
		with(lat(ModeRCSend), func(c *Config) { c.LLP = LLPXDP }),
		with(lat(ModeRawTCP), func(c *Config) { c.LLP = LLPXDP }),
		with(lat(ModeUDSend), func(c *Config) { c.LLPFallback = true }),
		with(lat(ModeRawXDP), func(c *Config) { c.LLP, c.LLPFallback = LLPXDP, true }),
		with(lat(ModeRawXDP), func(c *Config) { c.Loss = 0.1 }),
		with(bw(ModeRawXDP), func(c *Config) { c.Segment = 1000 }),
		with(lat(ModeRawXDP), func(c *Config) { c.NoCRC = true }),
	} {
		err := c.Check()
		if err == nil {
			t.Errorf("%+v: accepted", c)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, "\n") || msg == "" {
			t.Errorf("%+v: not one line: %q", c, msg)
		}
		if _, rerr := Run(c); rerr == nil || !strings.Contains(rerr.Error(), err.Error()) {
			t.Errorf("%+v: Run gave %v, Check %v", c, rerr, err)
		}
	}
	// What each mode does act on passes.
	for _, c := range []Config{
		with(bw(ModeUDSend), func(c *Config) { c.Loss, c.QPs = 0.1, 2 }),
		with(bw(ModeUDWriteRecord), func(c *Config) { c.Loss, c.Partial, c.Segment, c.Interval = 0.1, true, 1000, time.Millisecond }),
		with(lat(ModeRDWrite), func(c *Config) { c.Loss, c.Segment = 0.1, 1000 }),
		with(lat(ModeRDSend), func(c *Config) { c.Loss, c.QPs = 0.1, 4 }),
		with(bw(ModeRDSend), func(c *Config) { c.Size, c.Segment = 1<<20, 1400 }), // segmented like a Write
		with(bw(ModeRawTCP), func(c *Config) { c.QPs, c.Bidir = 3, true }),
		with(lat(ModeRawUDPUnconnected), func(c *Config) { c.QPs = 2 }),
		with(lat(ModeRawUDP), func(c *Config) { c.Size = 65507 }),
		with(lat(ModeUDSend), func(c *Config) { c.Size = MaxSize(ModeUDSend) }),
		with(lat(ModeUDSend), func(c *Config) { c.LLP = LLPXDP }),
		with(bw(ModeRDWrite), func(c *Config) { c.LLP, c.LLPFallback, c.Segment = LLPXDP, true, 1400 }),
		with(bw(ModeUDWriteRecord), func(c *Config) { c.LLP = LLPUDP }),
		with(bw(ModeRawXDP), func(c *Config) { c.Rate = 1 }),
		lat(ModeRawXDP),
	} {
		if err := c.Check(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

// TestXDPNotLocal: AF_XDP in one process (raw-xdp, or -llp xdp under a
// queue-pair mode) is refused with the reason, before anything opens:
// both ends would be on loopback, where AF_XDP never attaches.
func TestXDPNotLocal(t *testing.T) {
	for _, c := range []Config{
		{Mode: ModeRawXDP, Test: TestLat, Poll: qp.PollBusy, Size: 64},
		{Mode: ModeUDSend, Test: TestBW, Poll: qp.PollEvent, Size: 64, LLP: LLPXDP},
	} {
		if _, err := Run(c); !errors.Is(err, ErrXDPLoopback) {
			t.Errorf("%s llp %q: %v, want ErrXDPLoopback", c.Mode, c.LLP, err)
		}
	}
	if _, err := llp.InterfaceOf(netip.MustParseAddr("127.0.0.1")); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("llp.InterfaceOf(127.0.0.1): %v", err)
	}
}

// TestUDSendLoss: -loss acts on ud-send bandwidth (the sender's
// impairment layer drops), as on ud-wr's. It used to be ignored: nothing
// was lost.
func TestUDSendLoss(t *testing.T) {
	r, err := Run(Config{Mode: ModeUDSend, Test: TestBW, Poll: qp.PollEvent, Size: 1000, Duration: 200 * time.Millisecond, Loss: 0.5, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	// Half dropped by the impairment layer; a loaded receiver may lose
	// more, never fewer.
	if r.Sent < 100 || r.Lost*10 < r.Sent*3 {
		t.Fatalf("loss 0.5: %d of %d lost", r.Lost, r.Sent)
	}
}
