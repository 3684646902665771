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
	"github.com/udiwarp/udiwarp/socketshim"
)

// sendStats is what the sender reports.
type sendStats struct {
	Role      string  `json:"role"`
	Transport string  `json:"transport"`
	Receiver  string  `json:"receiver"`
	TS        bool    `json:"ts"`
	Bytes     uint64  `json:"bytes"`
	Chunks    uint64  `json:"chunks"`
	Seconds   float64 `json:"duration_s"`
	Mbps      float64 `json:"rate_mbps"`
	Dropped   uint64  `json:"dropped_no_credit"`
	Impaired  uint64  `json:"impaired"`
	Foreign   uint64  `json:"foreign_requests"`
	// Challenges: requests from a source that had not proved its address
	// (no valid cookie), each answered by one challenge no larger than it.
	Challenges uint64 `json:"challenges"`
}

func send(args []string, stdin io.Reader, stdout, stderr io.Writer, stop <-chan struct{}) error {
	fs := flag.NewFlagSet("udstream send", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	listen := fs.String("listen", "127.0.0.1:5004", "IP:PORT receivers ask at (UDP; rc: TCP); udp and send-ud: one of the host's unicast addresses")
	in := fs.String("i", "", "input: a file, - for stdin, or udp://IP:PORT to take a UDP/RTP feed (ffmpeg ... -f mpegts udp://IP:PORT)")
	chunk := fs.Int("chunk", 0, "bytes of stream per datagram (default: 112 TS packets, 21056 B, for Write-Record and rc; 7, 1316 B, for send-ud and udp)")
	segment := fs.Int("segment", 1316, "Write-Record segment payload: one datagram on the wire (1316 B is 7 TS packets, as RTP carries them)")
	speed := fs.Float64("speed", 1, "pace at this many times the stream's rate (its PCR, or -rate); 0: as fast as the transport takes it")
	rate := fs.Float64("rate", 0, "the stream's rate in bits/s, to pace an input that is not MPEG-TS")
	tsMode := fs.String("ts", "auto", "treat the input as MPEG-TS: auto (if it starts with sync bytes), on, off")
	idle := fs.Duration("idle", 2*time.Second, "udp:// input: the feed has ended after this long without a datagram")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := c.check(); err != nil {
		return badUse(err)
	}
	la, err := addrFlag("listen", *listen)
	if err != nil {
		return err
	}
	if c.transport == tUDP || c.transport == tSendUD {
		if why := notUnicast(la.Addr()); why != "" {
			return badUse(fmt.Errorf("-listen %v: %s; name one of this host's unicast addresses", la, why))
		}
	}
	switch {
	case *in == "":
		return badUse(errors.New("-i: name the input (a file, - for stdin, or udp://IP:PORT)"))
	case *speed < 0 || *rate < 0 || *idle <= 0:
		return badUse(fmt.Errorf("-speed %v, -rate %v, -idle %v: not negative (-idle positive)", *speed, *rate, *idle))
	case *tsMode != "auto" && *tsMode != "on" && *tsMode != "off":
		return badUse(fmt.Errorf("-ts %q: auto, on or off", *tsMode))
	case *segment < 188 || *segment > 65000:
		return badUse(fmt.Errorf("-segment %d: want 188..65000", *segment))
	}
	if *chunk == 0 {
		*chunk = 112 * mpegts.PacketSize
		if c.transport == tSendUD || c.transport == tUDP {
			*chunk = 7 * mpegts.PacketSize
		}
	}
	if *chunk < mpegts.PacketSize || *chunk > 65000-hdrSize {
		return badUse(fmt.Errorf("-chunk %d: want %d..%d", *chunk, mpegts.PacketSize, 65000-hdrSize))
	}
	src, err := openSource(*in, stdin, *idle, c.wait)
	if err != nil {
		return err
	}
	defer src.close()
	// The first bytes say whether the input is a transport stream (a
	// whole number of packets, in case it is).
	first := make([]byte, *chunk-*chunk%mpegts.PacketSize, *chunk)
	n, rerr := src.next(first)
	if n == 0 {
		if rerr == nil || rerr == io.EOF {
			return badUse(fmt.Errorf("-i %s: the input is empty", *in))
		}
		return rerr
	}
	if rerr != nil && rerr != io.EOF {
		return fmt.Errorf("-i %s: %w", *in, rerr)
	}
	ts := mpegts.Looks(first[:n])
	switch {
	case *tsMode == "on" && !ts:
		return badUse(fmt.Errorf("-i %s: not an MPEG-TS (no 0x47 sync byte every 188 bytes); -ts off streams it as bytes", *in))
	case *tsMode == "off":
		ts = false
	}
	if ts { // whole packets per chunk: a hole then costs whole packets
		*chunk -= *chunk % mpegts.PacketSize
	}
	first = first[:*chunk]
	o := linkOpts{loss: c.loss, seed: c.seed, segment: *segment, slot: 65536}
	live := !c.quiet && terminal(stderr)
	st := &sendStats{Role: "send", Transport: c.transport, TS: ts}
	p := pacer{speed: *speed, ts: ts, rate: *rate, live: src.udp != nil}
	var sendChunk func(b []byte, seq uint32) error
	var finish func(chunks uint32, bytes uint64)
	var closeLink func()
	if c.transport == tRC {
		conn, err := acceptRC(la, o, c.wait, stop)
		if err != nil {
			return err
		}
		st.Receiver = conn.RemoteAddr().String()
		closeLink = func() { conn.Close() }
		sendChunk = func(b []byte, _ uint32) error {
			if _, err := conn.Write(b); err != nil {
				return fmt.Errorf("the receiver went away: %w", err)
			}
			return nil
		}
		finish = func(uint32, uint64) {
			// The end of the stream, then the receiver's own close: it has
			// read everything once it closes, so closing first cannot cut
			// off what TCP still holds (under loss, retransmissions).
			conn.CloseWrite()
			conn.SetReadDeadline(time.Now().Add(rcDrainWait))
			io.Copy(io.Discard, conn)
		}
	} else {
		d, err := listenDgram(c.transport, network(la), la.String(), o)
		if err != nil {
			return fmt.Errorf("-listen %s: %w", la, err)
		}
		closeLink = func() { d.Close() }
		peer, tag, err := awaitRequest(d, c.wait, stop, st)
		if err != nil {
			d.Close()
			return err
		}
		st.Receiver = peer.String()
		buf := make([]byte, hdrSize+*chunk)
		var flags byte
		if ts {
			flags = tsFlag
		}
		// A Write-Record receiver that stops reading stops granting
		// slots, and each chunk is dropped after CreditWait: after
		// goneAfter of nothing but drops, it is gone. (A UDP or UD Send
		// receiver gives no such sign, as with any datagram socket.)
		var dropping time.Time
		var lastDropped uint64
		sendChunk = func(b []byte, seq uint32) error {
			putHeader(buf, dataKind, flags, seq, tag)
			n := copy(buf[hdrSize:], b)
			if err := d.write(buf[:hdrSize+n], peer); err != nil {
				if errors.Is(err, socketshim.ErrNoPeer) {
					return fmt.Errorf("the receiver at %v did not answer the Write-Record handshake", peer)
				}
				return err
			}
			switch dropped, _ := d.stats(); {
			case dropped == lastDropped:
				dropping = time.Time{}
			case dropping.IsZero():
				dropping = time.Now()
			case time.Since(dropping) > goneAfter:
				return fmt.Errorf("the receiver at %v stopped taking the stream: %d chunks dropped for want of a slot over %v", peer, dropped, goneAfter)
			}
			lastDropped, _ = d.stats()
			return nil
		}
		finish = func(chunks uint32, bytes uint64) {
			var end [endSize]byte
			putHeader(end[:], endKind, 0, chunks, tag)
			binary.BigEndian.PutUint64(end[hdrSize:], bytes)
			for range endRepeats { // it may be lost: the receiver's -idle ends it anyway
				d.write(end[:], peer)
				time.Sleep(20 * time.Millisecond)
			}
			st.Dropped, st.Impaired = d.stats()
		}
	}
	defer closeLink()
	start := time.Now()
	lastLine := start
	buf := first // the first chunk's n bytes, then each next one's
	var seq uint32
	for n > 0 {
		select {
		case <-stop:
			return errors.New("interrupted")
		default:
		}
		p.wait(buf[:n])
		if err := sendChunk(buf[:n], seq); err != nil {
			return err
		}
		seq++
		st.Chunks++
		st.Bytes += uint64(n)
		if live && time.Since(lastLine) > 500*time.Millisecond {
			lastLine = time.Now()
			fmt.Fprintf(stderr, "\r%-7s sent %8.2f MB  %7.2f Mb/s   ", c.transport, float64(st.Bytes)/1e6, float64(st.Bytes)*8/time.Since(start).Seconds()/1e6)
		}
		if rerr != nil {
			break
		}
		n, rerr = src.next(buf)
		if rerr != nil && rerr != io.EOF {
			return fmt.Errorf("-i %s: %w", *in, rerr)
		}
	}
	finish(seq, st.Bytes)
	st.Seconds = time.Since(start).Seconds()
	if st.Seconds > 0 {
		st.Mbps = float64(st.Bytes) * 8 / st.Seconds / 1e6
	}
	if live {
		fmt.Fprintln(stderr)
	}
	if c.json {
		printJSON(stdout, st)
	} else if !c.quiet {
		fmt.Fprintf(stderr, "udstream: sent %d bytes in %d chunks to %s over %s in %.2f s (%.2f Mb/s)\n", st.Bytes, st.Chunks, st.Receiver, c.transport, st.Seconds, st.Mbps)
	}
	return nil
}

// rcDrainWait bounds how long an RC sender waits, after the end of the
// stream, for the receiver to close its side.
const rcDrainWait = 10 * time.Second

// goneAfter is how long a Write-Record sender drops every chunk for want
// of a slot before it takes the receiver for gone.
const goneAfter = 2 * time.Second

// awaitRequest waits up to wait for a request from a receiver that
// proved its address, and returns the address and the stream's tag. A
// request that does not echo this sender's cookie for its source draws
// one challenge, no larger than the request, and nothing else: nothing
// goes to an address before it has shown it receives there, so a forged
// request can neither aim the stream at a victim nor draw more bytes to
// it than it carried. Datagrams that are not a request are counted
// (st.Foreign) and dropped.
func awaitRequest(d dgram, wait time.Duration, stop <-chan struct{}, st *sendStats) (netip.AddrPort, uint64, error) {
	end := time.Now().Add(wait)
	buf := make([]byte, 65536)
	var chal [chalSize]byte
	ck := newCookies()
	for time.Now().Before(end) {
		select {
		case <-stop:
			return netip.AddrPort{}, 0, errors.New("interrupted")
		default:
		}
		d.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, from, _, partial, err := d.read(buf)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			return netip.AddrPort{}, 0, err
		}
		kind, _, _, tag, ok := header(buf[:n])
		if !ok || kind != reqKind || partial || n < reqSize || tag == 0 || !mayBeSource(from) {
			st.Foreign++
			continue
		}
		if ck.valid(binary.BigEndian.Uint64(buf[hdrSize:]), from, tag) {
			d.SetReadDeadline(time.Time{})
			return from, tag, nil
		}
		putHeader(chal[:], chalKind, 0, 0, tag)
		binary.BigEndian.PutUint64(chal[hdrSize:], ck.issue(from, tag))
		d.write(chal[:], from) // lost or refused: the receiver asks again
		st.Challenges++
	}
	return netip.AddrPort{}, 0, fmt.Errorf("no receiver asked for the stream within %v", wait)
}

// mayBeSource says whether a datagram from ap may be answered: not from
// an address no datagram can come from (multicast, broadcast,
// unspecified, port 0), as docs/wire.md §6.2 has it.
func mayBeSource(ap netip.AddrPort) bool {
	a := ap.Addr()
	return a.IsValid() && !a.IsUnspecified() && !a.IsMulticast() && ap.Port() != 0 &&
		a != netip.AddrFrom4([4]byte{255, 255, 255, 255})
}

// notUnicast says why a udp or send-ud sender may not listen on a: a
// socket there takes datagrams sent to many hosts at once (a wildcard
// address takes those sent to a broadcast or multicast address), so that
// one forged request would draw a challenge from every sender that took
// it (docs/wire.md §6.2: a datagram sent to a group draws no reply). The
// Write-Record transports answer only peers their socket has proved, and
// rc is TCP. "" if a is a unicast address.
func notUnicast(a netip.Addr) string {
	switch {
	case a.IsUnspecified():
		return "a wildcard address also takes requests sent to a broadcast or multicast address"
	case a.IsMulticast():
		return "a multicast address"
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "the broadcast address"
	case !a.Is4():
		return ""
	}
	addrs, _ := net.InterfaceAddrs()
	for _, ia := range addrs {
		n, ok := ia.(*net.IPNet)
		if !ok {
			continue
		}
		ones, bits := n.Mask.Size()
		ip, ok := netip.AddrFromSlice(n.IP.To4())
		if !ok || bits != 32 || ones >= 31 {
			continue
		}
		b := ip.As4()
		host := ^uint32(0) >> ones
		v := binary.BigEndian.Uint32(b[:]) | host
		if netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}) == a {
			return "the broadcast address of " + n.String()
		}
	}
	return ""
}

// acceptRC waits up to wait for the receiver's RC connection.
func acceptRC(la netip.AddrPort, o linkOpts, wait time.Duration, stop <-chan struct{}) (*socketshim.RCConn, error) {
	l, err := socketshim.ListenRC("tcp", la.String(), rcOpts(o))
	if err != nil {
		return nil, fmt.Errorf("-listen %s: %w", la, err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	go func() {
		select {
		case <-stop:
		case <-ctx.Done():
		}
		l.Close()
	}()
	c, err := l.AcceptRC()
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("no receiver connected within %v", wait)
		}
		return nil, err
	}
	return c, nil
}

// source is the stream's input.
type source struct {
	r       io.Reader
	closer  io.Closer
	udp     *net.UDPConn
	idle    time.Duration
	wait    time.Duration
	pending []byte // a datagram that did not fit the last chunk
	started bool
}

func openSource(in string, stdin io.Reader, idle, wait time.Duration) (*source, error) {
	switch {
	case in == "-":
		return &source{r: stdin}, nil
	case strings.HasPrefix(in, "udp://"):
		ap, err := netip.ParseAddrPort(strings.TrimPrefix(in, "udp://"))
		if err != nil {
			return nil, badUse(fmt.Errorf("-i %s: want udp://IP:PORT (%v)", in, err))
		}
		c, err := net.ListenUDP(network(ap), net.UDPAddrFromAddrPort(ap))
		if err != nil {
			return nil, fmt.Errorf("-i %s: %w", in, err)
		}
		c.SetReadBuffer(8 << 20)
		return &source{udp: c, closer: c, idle: idle, wait: wait}, nil
	}
	f, err := os.Open(in)
	if err != nil {
		return nil, badUse(fmt.Errorf("-i: %w", err))
	}
	return &source{r: f, closer: f}, nil
}

func (s *source) close() {
	if s.closer != nil {
		s.closer.Close()
	}
}

// next fills b with the stream's next bytes: a file's or stdin's up to
// len(b); a UDP feed's datagrams (an RTP datagram's payload, its header
// stripped) until b is full or 20 ms have passed since the first of
// them. A datagram that does not fit what b has left begins the next
// call's (one larger than b fills b and goes on there), so a feed's
// datagrams are carried whole and in order whatever their size, and
// next returns 0 bytes only with an error. It returns io.EOF with the
// last bytes, or when the stream has ended.
func (s *source) next(b []byte) (int, error) {
	if s.udp == nil {
		n, err := io.ReadFull(s.r, b)
		if err == io.ErrUnexpectedEOF {
			err = io.EOF
		}
		return n, err
	}
	n := copy(b, s.pending) // what the last datagram left over
	s.pending = s.pending[n:]
	if n == len(b) {
		return n, nil
	}
	var flushAt time.Time
	if n > 0 {
		flushAt = time.Now().Add(20 * time.Millisecond)
	}
	dg := make([]byte, 65536)
	for {
		limit := s.idle
		if !s.started {
			limit = s.wait
		}
		dl := time.Now().Add(limit)
		if !flushAt.IsZero() && flushAt.Before(dl) {
			dl = flushAt
		}
		s.udp.SetReadDeadline(dl)
		k, err := s.udp.Read(dg)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				if n > 0 {
					return n, nil // the chunk so far
				}
				if !s.started {
					return 0, fmt.Errorf("no datagram arrived within %v", s.wait)
				}
				return 0, io.EOF // the feed went quiet: its end
			}
			return n, err
		}
		s.started = true
		d := dg[:k]
		if p, ok := mpegts.RTPPayload(d); ok { // an RTP feed (ffmpeg -f rtp_mpegts): its TS packets
			d = p
		}
		if n+len(d) > len(b) {
			// It does not fit what this chunk has left: it begins the
			// next chunk, or, larger than a whole chunk, fills this one
			// and its rest begins the next (a datagram of any size is
			// carried whole, and none ends the stream: anyone may send
			// one to the feed's port).
			if n == 0 {
				n = copy(b, d)
				d = d[n:]
			}
			s.pending = append([]byte(nil), d...)
			return n, nil
		}
		n += copy(b[n:], d)
		if flushAt.IsZero() {
			flushAt = time.Now().Add(20 * time.Millisecond)
		}
		if n == len(b) {
			return n, nil
		}
	}
}

// pacer holds each chunk back until the stream's own clock says it is
// due: its first PCR against the first chunk's (MPEG-TS), or its bytes
// at -rate; -speed scales it. A live feed paces itself.
type pacer struct {
	speed float64
	ts    bool
	rate  float64
	live  bool
	t0    time.Time
	pcr0  uint64
	has   bool
	bytes uint64
}

func (p *pacer) wait(b []byte) {
	if p.speed == 0 || p.live {
		return
	}
	now := time.Now()
	if p.t0.IsZero() {
		p.t0 = now
	}
	var due time.Duration
	switch {
	case p.ts:
		pcr, ok := uint64(0), false
		mpegts.Packets(b, 0, 0, len(b), func(off int) {
			if !ok {
				pcr, ok = mpegts.PCR(b[off : off+mpegts.PacketSize])
			}
		})
		if !ok {
			return
		}
		if !p.has {
			p.pcr0, p.has = pcr, true
			return
		}
		due = mpegts.Since(p.pcr0, pcr)
		if due > time.Hour { // a discontinuity (a looped file, a new program): start again
			p.pcr0, p.t0 = pcr, now
			return
		}
	case p.rate > 0:
		due = time.Duration(float64(p.bytes) * 8 / p.rate * float64(time.Second))
		p.bytes += uint64(len(b))
	default:
		return
	}
	if d := time.Duration(float64(due)/p.speed) - now.Sub(p.t0); d > 0 {
		time.Sleep(d)
	}
}
