package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/udiwarp/udiwarp/internal/mpegts"
	"github.com/udiwarp/udiwarp/validitymap"
)

// recvStats is what the receiver reports (-json).
type recvStats struct {
	Role      string `json:"role"`
	Transport string `json:"transport"`
	Sender    string `json:"sender"`
	TS        bool   `json:"ts"`
	Partial   bool   `json:"partial_delivery"`
	// InitialBufferingMs: from the receiver's start — opening its socket
	// (for the udiwarp transports a device and a QP; for rc the TCP
	// connection and MPA), then the request — until it held -buffer of
	// stream (by its PCR, or -rate) and playback could start.
	InitialBufferingMs float64 `json:"initial_buffering_ms"`
	Seconds            float64 `json:"duration_s"`
	GoodputMbps        float64 `json:"goodput_mbps"`
	BytesSent          uint64  `json:"bytes_sent"` // as the sender's end message said (0: not received)
	BytesReceived      uint64  `json:"bytes_received"`
	BytesValid         uint64  `json:"bytes_valid"`
	ValidPct           float64 `json:"valid_pct"`
	Chunks             uint64  `json:"chunks"`
	ChunksPartial      uint64  `json:"chunks_partial"`
	ChunksLost         uint64  `json:"chunks_lost"`
	Holes              uint64  `json:"holes"`
	HoleBytes          uint64  `json:"hole_bytes"`
	TSForwarded        uint64  `json:"ts_packets_forwarded"`
	TSDropped          uint64  `json:"ts_packets_dropped"`
	Stalls             uint64  `json:"stalls"`
	RebufferingMs      float64 `json:"rebuffering_ms"`
	Foreign            uint64  `json:"foreign_datagrams"`
	// Rejected: datagrams from the sender's address that are not its
	// stream's: without the stream's tag (forged: the source address of a
	// datagram proves nothing), a chunk more than chunkWindow ahead, an
	// end that contradicts what arrived. None changes the stream.
	Rejected uint64 `json:"rejected_datagrams"`
	Ended    bool   `json:"ended"` // the sender's end arrived (else -idle ended it)
}

func recv(args []string, stdout, stderr io.Writer, stop <-chan struct{}) error {
	fs := flag.NewFlagSet("udstream recv", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	from := fs.String("from", "127.0.0.1:5004", "the sender's -listen IP:PORT")
	bind := fs.String("bind", "", "IP:PORT to receive on (default: the sender's family, any port)")
	out := fs.String("o", "-", "output: a file, - for stdout, or udp://IP:PORT for a player (vlc udp://@:PORT, ffplay udp://IP:PORT)")
	buffer := fs.Duration("buffer", 500*time.Millisecond, "stream time to hold before playback starts (initial buffering), by the stream's PCR or -rate")
	rate := fs.Float64("rate", 0, "the stream's rate in bits/s, to clock a stream that is not MPEG-TS")
	deadline := fs.Duration("deadline", 50*time.Millisecond, "wr-ud: a record's deadline; then it is delivered partial (or dropped with -discard)")
	discard := fs.Bool("discard", false, "wr-ud: whole records only (a record with a segment lost is dropped), for comparison")
	idle := fs.Duration("idle", 3*time.Second, "end when nothing arrives for this long (the sender's end message may be lost)")
	tsMode := fs.String("ts", "auto", "forward whole 188-byte TS packets only: auto (when the stream starts with sync bytes), on, off")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := c.check(); err != nil {
		return badUse(err)
	}
	sender, err := addrFlag("from", *from)
	if err != nil {
		return err
	}
	switch {
	case *buffer < 0 || *rate < 0 || *deadline <= 0 || *idle <= 0:
		return badUse(fmt.Errorf("-buffer %v, -rate %v: not negative; -deadline %v, -idle %v: positive", *buffer, *rate, *deadline, *idle))
	case *tsMode != "auto" && *tsMode != "on" && *tsMode != "off":
		return badUse(fmt.Errorf("-ts %q: auto, on or off", *tsMode))
	case *discard && c.transport != tWRUD:
		return badUse(fmt.Errorf("-discard: only wr-ud delivers partial records, not %s", c.transport))
	}
	if *bind == "" {
		*bind = netip.AddrPortFrom(netip.IPv4Unspecified(), 0).String()
		if sender.Addr().Is6() {
			*bind = "[::]:0"
		}
		if sender.Addr().IsLoopback() {
			*bind = netip.AddrPortFrom(sender.Addr(), 0).String()
		}
	}
	ba, err := addrFlag("bind", *bind)
	if err != nil {
		return err
	}
	o, err := openOutput(*out, stdout)
	if err != nil {
		return err
	}
	defer o.close()
	jsonOut := stdout
	if *out == "-" {
		jsonOut = stderr
	}
	st := &recvStats{Role: "recv", Transport: c.transport, Sender: sender.String(), Partial: c.transport == tWRUD && !*discard}
	r := &receiver{st: st, out: o, tsMode: *tsMode, pl: player{need: *buffer, rate: *rate}}
	live := !c.quiet && terminal(stderr)
	lo := linkOpts{loss: c.loss, seed: c.seed, segment: 1316, partial: !*discard, deadline: *deadline, slot: 65536}
	start := time.Now()
	r.pl.begin(start)
	if c.transport == tRC {
		err = r.stream(sender, lo, c.wait, *idle, stop, live, stderr)
	} else {
		err = r.datagrams(ba, sender, lo, c.wait, *idle, stop, live, stderr)
	}
	if ferr := o.flush(); err == nil && ferr != nil {
		err = fmt.Errorf("-o %s: %w", *out, ferr)
	}
	r.finish(time.Now())
	if live {
		fmt.Fprintln(stderr)
	}
	if c.json {
		printJSON(jsonOut, st)
	} else if !c.quiet && st.Chunks > 0 {
		fmt.Fprintf(stderr, "udstream: %d of %d bytes valid (%.1f %%) in %.2f s; initial buffering %.0f ms; %d holes; TS packets forwarded %d, dropped %d; stalls %d\n",
			st.BytesValid, max(st.BytesSent, st.BytesReceived), st.ValidPct, st.Seconds, st.InitialBufferingMs, st.Holes, st.TSForwarded, st.TSDropped, st.Stalls)
	}
	if err == nil && !st.Ended && c.transport != tRC {
		err = fmt.Errorf("the stream ended short: the sender went silent for %v before its end message (it vanished, or the message was lost) after %d chunks; what arrived was written", *idle, r.next)
	}
	return err
}

// receiver turns what arrives into the output and the figures.
type receiver struct {
	st     *recvStats
	out    *output
	tsMode string
	pl     player
	next   uint32 // the chunk expected next
	far    uint32 // the chunk after the last one dropped as too far ahead
	farRun int    // consecutive chunks dropped as too far ahead, ending at far-1
	endN   uint32 // the chunks the sender's end said it sent (when ended)
	endAt  time.Time
	first  bool // the first chunk has been seen (TS decided)
	pcr0   uint64
	hasPCR bool
	pos    time.Duration // stream time available
	bytes  uint64        // valid bytes forwarded (the -rate clock)
}

// datagrams receives over a datagram transport: it asks for the stream
// (proving its address with the cookie the sender's challenge brings),
// then takes the chunks that carry the stream's tag until the sender's
// end (or -idle of silence).
func (r *receiver) datagrams(ba, sender netip.AddrPort, o linkOpts, wait, idle time.Duration, stop <-chan struct{}, live bool, stderr io.Writer) error {
	d, err := listenDgram(r.st.Transport, network(ba), ba.String(), o)
	if err != nil {
		return fmt.Errorf("-bind %s: %w", ba, err)
	}
	defer d.Close()
	tag := newTag()
	var req [reqSize]byte
	var cookie uint64 // the sender's for this address, from its challenge
	ask := func() error {
		putHeader(req[:], reqKind, 0, 0, tag)
		binary.BigEndian.PutUint64(req[hdrSize:], cookie)
		return d.write(req[:], sender)
	}
	// After the sender's end, chunks still on their way (a Write-Record
	// record at its deadline, a reordered datagram) get linger to arrive.
	linger := 100*time.Millisecond + 2*o.deadline
	buf := make([]byte, o.slot)
	askUntil := time.Now().Add(wait)
	lastAsk := time.Time{}
	lastData := time.Time{}
	lastLine := time.Now()
	got := false
	var askErr error
	for {
		select {
		case <-stop:
			return errors.New("interrupted")
		default:
		}
		now := time.Now()
		switch {
		case r.st.Ended:
			if r.next == r.endN || now.Sub(r.endAt) > linger {
				r.st.ChunksLost += uint64(uint32(r.endN - r.next)) // the tail, lost
				r.next = r.endN
				return nil
			}
		case !got:
			if now.After(askUntil) {
				if askErr != nil {
					return fmt.Errorf("no stream from %v within %v (is the sender there, with the same -t?): %w", sender, wait, askErr)
				}
				return fmt.Errorf("no stream from %v within %v (is the sender there, with the same -t?)", sender, wait)
			}
			if now.Sub(lastAsk) >= 200*time.Millisecond {
				// The sender may not be there yet (a Write-Record socket's
				// handshake then fails): ask again until -wait.
				lastAsk = now
				if err := ask(); err != nil {
					askErr = err
				}
			}
		case now.Sub(lastData) > idle:
			return nil
		}
		r.pl.tick(now)
		if live && now.Sub(lastLine) > 500*time.Millisecond {
			lastLine = now
			r.line(stderr, now)
		}
		d.SetReadDeadline(now.Add(50 * time.Millisecond))
		n, from, valid, partial, err := d.read(buf)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			return err
		}
		if from != sender {
			r.st.Foreign++ // a flood, or a stray: never the stream
			continue
		}
		now = time.Now()
		if partial && !headerValid(valid) {
			// A Write-Record whose header was lost: the next chunk, on
			// the Write-Record socket's word that it is the sender's.
			if r.admit(r.next) {
				got, lastData = true, now
				if err := r.chunk(now, r.next, buf[hdrSize:n], shift(valid, n), partial); err != nil {
					return err
				}
			}
			continue
		}
		kind, flags, seq, t, ok := header(buf[:n])
		switch {
		case !ok:
			r.st.Foreign++
			continue
		case t != tag:
			r.st.Rejected++ // forged (the tag never left the two ends), or another stream's
			continue
		}
		switch kind {
		case chalKind:
			if got || n < chalSize {
				continue
			}
			if c := binary.BigEndian.Uint64(buf[hdrSize:]); c != cookie {
				// The sender's answer to a request of ours: ask again at
				// once, proving the address with its cookie.
				cookie, lastAsk = c, now
				if err := ask(); err != nil {
					askErr = err
				}
			}
		case endKind:
			if n < endSize || !r.end(now, seq, binary.BigEndian.Uint64(buf[hdrSize:])) {
				r.st.Rejected++
			}
		case dataKind:
			if !r.admit(seq) {
				continue
			}
			got, lastData = true, now
			if !r.first { // the sender says whether it is MPEG-TS
				r.decide(flags&tsFlag != 0)
			}
			if err := r.chunk(now, seq, buf[hdrSize:n], shift(valid, n), partial); err != nil {
				return err
			}
		default:
			r.st.Foreign++
		}
	}
}

// admit says whether chunk seq, of the stream's, is taken: not one
// already passed (a duplicate, or a straggler), not more than
// chunkWindow ahead of the next (unless the resyncRun-th of a run of
// consecutive chunks that far ahead: the stream moved on past a long
// gap), and not past the sender's end.
func (r *receiver) admit(seq uint32) bool {
	d := seqDiff(r.next, seq)
	switch {
	case d < 0:
		return false
	case r.st.Ended && seqDiff(r.endN, seq) >= 0:
		// A chunk the end said was never sent: the end was not the
		// sender's last word after all (it cannot be forged off-path, so
		// this is a sender that restarted its numbering, or an on-path
		// forger); it no longer holds.
		r.st.Ended, r.st.BytesSent = false, 0
		r.st.Rejected++
	}
	if d <= chunkWindow {
		r.farRun = 0
		return true
	}
	if r.farRun > 0 && seq == r.far {
		r.farRun++
	} else {
		r.farRun = 1
	}
	r.far = seq + 1
	if r.farRun < resyncRun {
		r.st.Rejected++
		return false
	}
	r.farRun = 0
	return true
}

// end takes the sender's end: chunks chunks, bytes bytes. An end that
// says fewer chunks than have arrived is not the sender's (false); one
// that says more leaves linger for the rest before they count as lost.
func (r *receiver) end(now time.Time, chunks uint32, bytes uint64) bool {
	if seqDiff(r.next, chunks) < 0 {
		return false
	}
	if !r.st.Ended || r.endN != chunks {
		r.endAt = now
	}
	r.st.Ended, r.endN, r.st.BytesSent = true, chunks, bytes
	return true
}

func isTemporary(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// headerValid says a partial record's header arrived.
func headerValid(valid []validitymap.Range) bool {
	return len(valid) > 0 && valid[0].Start == 0 && valid[0].End >= hdrSize
}

// shift turns a record's valid ranges into its payload's (after the
// header); nil means all of it.
func shift(valid []validitymap.Range, n int) []validitymap.Range {
	if valid == nil {
		return nil
	}
	out := make([]validitymap.Range, 0, len(valid))
	for _, v := range valid {
		lo, hi := max(v.Start, hdrSize), min(v.End, uint64(n))
		if lo < hi {
			out = append(out, validitymap.Range{Start: lo - hdrSize, End: hi - hdrSize})
		}
	}
	return out
}

// stream receives over RC: a byte stream, read in the sender's chunks'
// size; it ends at the sender's close.
func (r *receiver) stream(sender netip.AddrPort, o linkOpts, wait, idle time.Duration, stop <-chan struct{}, live bool, stderr io.Writer) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	conn, err := dialRC(ctx, sender.String(), wait, o)
	if err != nil {
		return fmt.Errorf("no stream from %v within %v: %w", sender, wait, err)
	}
	defer conn.Close()
	go func() { <-ctx.Done(); conn.Close() }()
	buf := make([]byte, 112*mpegts.PacketSize)
	lastLine := time.Now()
	for seq := uint32(0); ; seq++ {
		conn.SetReadDeadline(time.Now().Add(idle))
		n, err := io.ReadFull(conn, buf)
		now := time.Now()
		if n > 0 {
			if err := r.chunk(now, seq, buf[:n], nil, false); err != nil {
				return err
			}
		}
		if live && now.Sub(lastLine) > 500*time.Millisecond {
			lastLine = now
			r.line(stderr, now)
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			r.st.Ended = true
			r.st.BytesSent = r.st.BytesReceived
			return nil
		case ctx.Err() != nil:
			return errors.New("interrupted")
		case isTemporary(err):
			return fmt.Errorf("the sender went silent for %v", idle)
		default:
			return fmt.Errorf("the stream broke: %w", err)
		}
	}
}

// chunk takes chunk seq of the stream: b, of which valid says what
// arrived (nil: all of it).
func (r *receiver) chunk(now time.Time, seq uint32, b []byte, valid []validitymap.Range, partial bool) error {
	st := r.st
	if seq < r.next {
		return nil // a duplicate, or older than one already taken
	}
	if seq > r.next {
		st.ChunksLost += uint64(seq - r.next)
		if st.TS {
			st.TSDropped += uint64(seq-r.next) * uint64(len(b)/mpegts.PacketSize)
		}
	}
	r.next = seq + 1
	if !r.first { // no header said (RC, or a first record whose header was lost)
		r.decide(looksTS(b, valid))
	}
	st.Chunks++
	st.BytesReceived += uint64(len(b))
	if partial {
		st.ChunksPartial++
	}
	if valid == nil {
		valid = []validitymap.Range{{Start: 0, End: uint64(len(b))}}
	}
	at := uint64(0)
	for _, v := range valid {
		if v.Start > at {
			st.Holes++
			st.HoleBytes += v.Start - at
		}
		at = v.End
		st.BytesValid += v.Len()
	}
	if at < uint64(len(b)) {
		st.Holes++
		st.HoleBytes += uint64(len(b)) - at
	}
	if !st.TS {
		for _, v := range valid {
			if err := r.out.write(b[v.Start:v.End]); err != nil {
				return err
			}
			r.bytes += v.Len()
		}
		if r.pl.rate > 0 {
			r.pl.arrive(now, time.Duration(float64(r.bytes)*8/r.pl.rate*float64(time.Second)))
		} else {
			r.pl.arrive(now, -1)
		}
		return nil
	}
	whole := 0
	for _, v := range valid {
		var werr error
		whole += mpegts.Packets(b, 0, int(v.Start), int(v.End), func(off int) {
			p := b[off : off+mpegts.PacketSize]
			if pcr, ok := mpegts.PCR(p); ok {
				if !r.hasPCR {
					r.pcr0, r.hasPCR = pcr, true
				}
				if d := mpegts.Since(r.pcr0, pcr); d < time.Hour {
					r.pos = max(r.pos, d)
				}
			}
			if werr == nil {
				werr = r.out.write(p)
			}
		})
		if werr != nil {
			return werr
		}
	}
	st.TSForwarded += uint64(whole)
	if expect := len(b) / mpegts.PacketSize; whole < expect {
		st.TSDropped += uint64(expect - whole)
	}
	if r.hasPCR {
		r.pl.arrive(now, r.pos)
	} else {
		r.pl.arrive(now, -1)
	}
	return nil
}

// decide settles whether the stream is forwarded as MPEG-TS: -ts on or
// off, or (auto) what the stream itself says.
func (r *receiver) decide(ts bool) {
	r.first = true
	switch r.tsMode {
	case "on":
		r.st.TS = true
	case "off":
		r.st.TS = false
	default:
		r.st.TS = ts
	}
}

// looksTS says whether the valid parts of a chunk cut at packet
// boundaries hold sync bytes wherever a packet starts (nil valid: all of
// it arrived).
func looksTS(b []byte, valid []validitymap.Range) bool {
	if valid == nil {
		return mpegts.Looks(b)
	}
	seen := 0
	for _, v := range valid {
		for p := (v.Start + mpegts.PacketSize - 1) / mpegts.PacketSize * mpegts.PacketSize; p < v.End && p < uint64(len(b)); p += mpegts.PacketSize {
			if b[p] != mpegts.Sync {
				return false
			}
			seen++
		}
	}
	return seen > 0
}

// finish closes the figures at now.
func (r *receiver) finish(now time.Time) {
	st := r.st
	r.pl.end(now)
	st.InitialBufferingMs = float64(r.pl.initial) / 1e6
	st.RebufferingMs = float64(r.pl.paused) / 1e6
	st.Stalls = r.pl.stalls
	st.Seconds = now.Sub(r.pl.start).Seconds()
	if st.Seconds > 0 {
		st.GoodputMbps = float64(st.BytesValid) * 8 / st.Seconds / 1e6
	}
	if total := max(st.BytesSent, st.BytesReceived); total > 0 {
		st.ValidPct = 100 * float64(st.BytesValid) / float64(total)
	}
}

// line draws the live line.
func (r *receiver) line(w io.Writer, now time.Time) {
	st := r.st
	el := now.Sub(r.pl.start).Seconds()
	pct := 0.0
	if st.BytesReceived > 0 {
		pct = 100 * float64(st.BytesValid) / float64(st.BytesReceived)
	}
	fmt.Fprintf(w, "\r%-7s %7.2f Mb/s  valid %5.1f %%  holes %d  buffer %5d ms  stalls %d   ",
		st.Transport, float64(st.BytesValid)*8/max(el, 1e-9)/1e6, pct, st.Holes, r.pl.level(now).Milliseconds(), r.pl.stalls)
}

// player models a player's buffer on the stream's clock: playback starts
// once need of stream time is held (initial buffering), then the stream
// plays out at its own rate; when it runs dry the player stalls and
// buffers need again before it resumes.
type player struct {
	need    time.Duration
	rate    float64
	start   time.Time // the request
	pos     time.Duration
	clocked bool // the stream has a clock (PCR or -rate)
	got     bool
	playing bool
	played  time.Time // playback's start, moved on by every rebuffering
	stallAt time.Time
	initial time.Duration
	paused  time.Duration
	stalls  uint64
	ended   bool
	// since: data arrived after the last stall began. A stall that nothing
	// followed when the stream ends was its end (a live feed stops, and
	// the sender waits -idle before it says so), not a stall.
	since bool
}

func (p *player) begin(now time.Time) { p.start = now }

// arrive says the stream is held up to pos (-1: it has no clock).
func (p *player) arrive(now time.Time, pos time.Duration) {
	p.got = true
	p.since = true
	if pos >= 0 {
		p.clocked = true
		p.pos = max(p.pos, pos)
	}
	p.tick(now)
}

// level is how much stream time is held ahead of playback.
func (p *player) level(now time.Time) time.Duration {
	if !p.playing {
		return p.pos
	}
	return p.pos - now.Sub(p.played)
}

func (p *player) tick(now time.Time) {
	switch {
	case !p.got || p.ended:
	case !p.clocked && p.initial == 0: // no clock: playback starts at the first byte
		p.initial = now.Sub(p.start)
		p.playing = true
	case !p.clocked:
	case !p.playing && p.initial == 0 && p.pos >= p.need:
		p.initial = now.Sub(p.start)
		p.played, p.playing = now, true
	case !p.playing && p.initial > 0 && p.pos-p.stallAt.Sub(p.played) >= p.need:
		p.paused += now.Sub(p.stallAt)
		p.played = p.played.Add(now.Sub(p.stallAt))
		p.playing = true
	case p.playing && p.level(now) < 0:
		p.stalls++
		p.playing = false
		p.stallAt = now
		p.since = false
	}
}

// end: the stream is complete; whatever is held plays out (a stream
// shorter than need starts playing now).
func (p *player) end(now time.Time) {
	if p.got && p.initial == 0 {
		p.initial = now.Sub(p.start)
	}
	switch {
	case !p.playing && !p.stallAt.IsZero() && !p.since:
		p.stalls-- // it ran dry at the stream's end: no stall
	case !p.playing && !p.stallAt.IsZero():
		p.paused += now.Sub(p.stallAt)
	}
	p.ended = true
}

// output is where the stream goes: a file, stdout, or UDP datagrams of
// seven TS packets (1316 bytes) to a player.
type output struct {
	w       io.Writer
	c       io.Closer
	udp     *net.UDPConn
	pending []byte
}

const outDatagram = 7 * mpegts.PacketSize

func openOutput(out string, stdout io.Writer) (*output, error) {
	switch {
	case out == "-":
		return &output{w: stdout}, nil
	case strings.HasPrefix(out, "udp://"):
		ap, err := netip.ParseAddrPort(strings.TrimPrefix(out, "udp://"))
		if err != nil {
			return nil, badUse(fmt.Errorf("-o %s: want udp://IP:PORT (%v)", out, err))
		}
		c, err := net.DialUDP(network(ap), nil, net.UDPAddrFromAddrPort(ap))
		if err != nil {
			return nil, fmt.Errorf("-o %s: %w", out, err)
		}
		return &output{udp: c, c: c}, nil
	}
	f, err := os.Create(out)
	if err != nil {
		return nil, badUse(fmt.Errorf("-o: %w", err))
	}
	return &output{w: f, c: f}, nil
}

func (o *output) write(b []byte) error {
	if o.udp == nil {
		_, err := o.w.Write(b)
		return err
	}
	o.pending = append(o.pending, b...)
	for len(o.pending) >= outDatagram {
		if _, err := o.udp.Write(o.pending[:outDatagram]); err != nil && !isRefused(err) {
			return err
		}
		o.pending = o.pending[outDatagram:]
	}
	if len(o.pending) == 0 {
		o.pending = o.pending[:0:0]
	}
	return nil
}

// isRefused: a player not listening (yet) makes the kernel refuse
// datagrams; the stream goes on, as any UDP sender's does.
func isRefused(err error) bool {
	return strings.Contains(err.Error(), "connection refused")
}

func (o *output) flush() error {
	if o.udp != nil && len(o.pending) > 0 {
		_, err := o.udp.Write(o.pending)
		o.pending = nil
		if err != nil && !isRefused(err) {
			return err
		}
	}
	if f, ok := o.w.(*os.File); ok && f != os.Stdout {
		return f.Sync()
	}
	return nil
}

func (o *output) close() {
	if o.c != nil {
		o.c.Close()
	}
}
