package protect

import (
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/udiwarp/udiwarp/llp"
	"github.com/udiwarp/udiwarp/reliability"
	"github.com/udiwarp/udiwarp/udiwarp"
)

// Stats counts what a Link did; each counter is a pointer, so that the
// device above can keep them among its own (Wrap fills those left nil).
// Every datagram refused is counted once, under the reason it was
// refused for.
type Stats struct {
	Sealed, Opened *atomic.Uint64
	// Contacts: Hellos and Challenges sent in Contact envelopes.
	Contacts *atomic.Uint64
	// Sessions: keys installed from contacts (as opener or answerer);
	// PSKPeers: receive keys installed from pre-shared keys.
	Sessions, PSKPeers *atomic.Uint64
	// KeyUpdates: receive keys moved to their next generation.
	KeyUpdates *atomic.Uint64
	// Refused datagrams, by reason.
	AuthFailed     *atomic.Uint64 // a tag that did not verify (forged, changed, wrong keys)
	Replayed       *atomic.Uint64 // a packet number seen before or older than the window
	NoKey          *atomic.Uint64 // a key ID this end does not hold, and nothing to derive it from
	Clear          *atomic.Uint64 // an unprotected frame (a Hello draws a Refuse besides)
	BadEnvelope    *atomic.Uint64 // a malformed envelope, or a Contact's CRC wrong
	ModeMismatch   *atomic.Uint64 // an envelope of another mode
	Unsolicited    *atomic.Uint64 // a Challenge for no Hello of ours
	Reflected      *atomic.Uint64 // a pre-shared-key datagram under one of our own key IDs
	ContactLimited *atomic.Uint64 // contact work over ContactRate
	PeersFull      *atomic.Uint64 // a new peer's keys over MaxPeers
	WrongSource    *atomic.Uint64 // a key ID from another address than the peer's it belongs to
	RefusesSent    *atomic.Uint64 // Refuse answers to contacts of another mode
	// TxNoKey: datagrams not sent for want of a key.
	TxNoKey *atomic.Uint64
}

// fill points every nil counter at a fresh one.
func (s *Stats) fill() {
	for _, p := range []**atomic.Uint64{&s.Sealed, &s.Opened, &s.Contacts, &s.Sessions, &s.PSKPeers, &s.KeyUpdates,
		&s.AuthFailed, &s.Replayed, &s.NoKey, &s.Clear, &s.BadEnvelope, &s.ModeMismatch, &s.Unsolicited,
		&s.Reflected, &s.ContactLimited, &s.PeersFull, &s.WrongSource, &s.RefusesSent, &s.TxNoKey} {
		if *p == nil {
			*p = new(atomic.Uint64)
		}
	}
}

// Refused is the sum of the refused datagrams.
func (s *Stats) Refused() uint64 {
	return s.AuthFailed.Load() + s.Replayed.Load() + s.NoKey.Load() + s.Clear.Load() + s.BadEnvelope.Load() +
		s.ModeMismatch.Load() + s.Unsolicited.Load() + s.Reflected.Load() + s.ContactLimited.Load() + s.PeersFull.Load() +
		s.WrongSource.Load()
}

// Link protects the datagrams of the link under it (see the package
// comment). Above it, frames travel as on today's wire with a zero CRC
// trailer (the device runs without CRC: the tag replaces it).
type Link struct {
	inner llp.Link
	cfg   Config
	st    Stats

	mu   sync.Mutex
	recv map[uint32]*recvSA // by key ID; changed only by the reader, under mu
	// tx is what each peer address is sealed to with: the newest contact
	// keys, else a pre-shared key's sender. Writers read it without a
	// lock; it is replaced whole, under mu.
	tx      atomic.Pointer[map[txKey]*peerTx]
	ownPSK  map[uint32]bool // key IDs our pre-shared-key senders use
	peerPSK map[netip.AddrPort][]byte
	hellos  map[helloKey]*opening // Hellos of ours awaiting their Challenge
	horder  []helloKey            // in the order sent, to bound hellos
	secret  [2][]byte             // answering keys: current, previous
	// used are the openings keys were derived for, under each secret:
	// an opening is derived once (a replay of its first frame, once its
	// keys were reclaimed, would open again and restart its packet
	// numbers under the same key). When the current set is full the
	// secret turns early, as RD's graveyard does.
	used    [2]map[opening2]bool
	perAddr map[netip.Addr]int // receive keys per peer address (MaxPerAddr)
	// pskRx are each address's pre-shared-key receive keys, newest last:
	// a sender moves to a new key ID every KeyUpdateAfter datagrams, and
	// the receiver keeps the newest two. retired remembers the key IDs
	// it dropped (at most maxRetired, oldest forgotten first), whose
	// datagrams, replayed, must not derive them again.
	pskRx    map[netip.AddrPort][]*recvSA
	retired  map[retiredKey]bool
	rorder   []retiredKey
	pskEpoch atomic.Uint64 // SetPeerKey calls: PSK receive keys are checked again
	turned   time.Time
	bucket   float64 // contact work allowed now (ContactRate)
	filled   time.Time

	// Read side: one reader at a time.
	rmsgs  []llp.Msg
	rbufs  [][]byte
	pend   []pending // datagrams read, not yet handed up
	pnext  int
	reads  uint64
	coarse time.Time
	left   atomic.Int32 // len(pend) - pnext, for WaitReadable in another goroutine
	rh     Header
	rdh    reliability.Header
	nonce  [12]byte

	wpool   sync.Pool // sealed datagrams' buffers
	batches sync.Pool // *wbatch
}

// opening2 names a contact as its answering side derives it.
type opening2 struct {
	src                netip.AddrPort
	hello              uint64
	openerQP, answerQP uint32
}

// MaxPerAddr bounds the receive keys one peer address may hold: one host
// completing contacts (or a PSK holder's restarts) cannot fill MaxPeers.
const MaxPerAddr = 64

type retiredKey struct {
	src   netip.AddrPort
	keyID uint32
}

const maxRetired = 1 << 14

type helloKey struct {
	dst   netip.AddrPort
	token uint64
}

type opening struct {
	priv  *ecdh.PrivateKey
	qp    uint32 // the opener's (ours)
	epoch uint32
	at    time.Time
}

// peerTx is what we seal to a peer with: a contact's opener→answerer or
// answerer→opener direction, or a pre-shared key's sender (rx nil).
type peerTx struct {
	sa      *sendSA
	initial atomic.Pointer[[]byte] // the initial block, until the peer answers under the keys
	rx      *recvSA
}

// txKey names a sender: a peer address (qps 0: what everything to the
// address is sealed with), or an RD contact still pending (qps: our QP
// << 32 | the peer's), whose keys seal only that QP pair's frames until
// a datagram from the peer opens under them. So a Challenge — which
// carries no tag, and an on-path attacker can forge — never re-keys the
// traffic of sessions that work.
type txKey struct {
	addr netip.AddrPort
	qps  uint64
}

// setTx makes p what k is sealed to (nil: nothing); l.mu held.
func (l *Link) setTx(dst txKey, p *peerTx) {
	old := *l.tx.Load()
	m := make(map[txKey]*peerTx, len(old)+1)
	for a, q := range old {
		m[a] = q
	}
	if p == nil {
		delete(m, dst)
	} else {
		m[dst] = p
	}
	l.tx.Store(&m)
}

type pending struct {
	b   []byte
	src netip.AddrPort
	m   *llp.Msg // the read below it came in: its destination
}

// maxHellos bounds the Hellos awaiting a Challenge.
const maxHellos = 4096

// Wrap protects inner under cfg; batch is the most datagrams one Read
// asks the link under it for, and st the counters to count in.
func Wrap(inner llp.Link, cfg Config, batch int, st Stats) (*Link, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	if cfg.Mode == None {
		return nil, errors.New("protect: Wrap with mode none")
	}
	if cfg.KeyUpdateAfter == 0 {
		cfg.KeyUpdateAfter = DefaultKeyUpdateAfter
	}
	if cfg.ContactRate <= 0 {
		cfg.ContactRate = DefaultContactRate
	}
	if cfg.SecretLifetime <= 0 {
		cfg.SecretLifetime = DefaultSecretLifetime
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.MaxPeers <= 0 {
		cfg.MaxPeers = DefaultMaxPeers
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Reader
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	batch = max(batch, 1)
	l := &Link{inner: inner, cfg: cfg, recv: map[uint32]*recvSA{}, ownPSK: map[uint32]bool{}, peerPSK: map[netip.AddrPort][]byte{},
		hellos: map[helloKey]*opening{}, perAddr: map[netip.Addr]int{}, pskRx: map[netip.AddrPort][]*recvSA{}, retired: map[retiredKey]bool{}, used: [2]map[opening2]bool{{}, {}}, rmsgs: make([]llp.Msg, batch), rbufs: make([][]byte, batch), st: st}
	l.st.fill()
	l.tx.Store(&map[txKey]*peerTx{})
	for a, k := range cfg.Peers {
		l.peerPSK[unmap(a)] = append([]byte(nil), k...)
	}
	max := inner.Caps().MaxDatagram
	for i := range l.rbufs {
		l.rbufs[i] = make([]byte, max)
		l.rmsgs[i].Bufs = [][]byte{l.rbufs[i]}
	}
	l.wpool.New = func() any { b := make([]byte, 0, max+TagSize+12); return &b }
	l.batches.New = func() any { return new(wbatch) }
	now := cfg.Now()
	l.secret[0], l.secret[1] = l.random(32), l.random(32)
	l.turned, l.filled, l.bucket = now, now, float64(cfg.ContactRate)
	return l, nil
}

func unmap(a netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()) }

func (l *Link) random(n int) []byte {
	b := make([]byte, n)
	if _, err := io.ReadFull(l.cfg.Rand, b); err != nil {
		panic("protect: no randomness: " + err.Error())
	}
	return b
}

// Stats returns the link's counters.
func (l *Link) Stats() *Stats { return &l.st }

// Mode is the link's mode.
func (l *Link) Mode() Mode { return l.cfg.Mode }

// SetPeerKey sets (or, with psk nil, removes) the pre-shared key for
// peer: what UD and Write-Record to it are sealed with when no contact
// gave keys, and what its contacts mix in.
func (l *Link) SetPeerKey(peer netip.AddrPort, psk []byte) error {
	if psk != nil && len(psk) < MinPSK {
		return errors.New("protect: pre-shared key shorter than 16 bytes")
	}
	peer = unmap(peer)
	l.mu.Lock()
	defer l.mu.Unlock()
	if psk == nil {
		delete(l.peerPSK, peer)
	} else {
		l.peerPSK[peer] = append([]byte(nil), psk...)
	}
	if p := (*l.tx.Load())[txKey{addr: peer}]; p != nil && p.rx == nil {
		l.setTx(txKey{addr: peer}, nil) // the next datagram keys afresh
	}
	l.pskEpoch.Add(1) // receive keys from the old key are checked again (revoked)
	return nil
}

// pskFor is the pre-shared key for peer, if any (l.mu held).
func (l *Link) pskFor(peer netip.AddrPort) []byte {
	if k, ok := l.peerPSK[peer]; ok {
		return k
	}
	return l.cfg.PSK
}

// Sessions reports how many receive keys the link holds.
func (l *Link) Sessions() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.recv) // (changed under l.mu)
}

// HasKeys reports whether the link can seal to peer now.
func (l *Link) HasKeys(peer netip.AddrPort) bool {
	peer = unmap(peer)
	l.mu.Lock()
	defer l.mu.Unlock()
	return (*l.tx.Load())[txKey{addr: peer}] != nil || l.pskFor(peer) != nil
}

// Caps: the link under it, less the envelope, with no trains.
func (l *Link) Caps() llp.Caps {
	c := l.inner.Caps()
	c.MaxDatagram -= MaxOverhead
	c.MaxTrain, c.GRO = 1, false
	c.Detail += ", protected (" + l.cfg.Mode.String() + ")"
	return c
}

func (l *Link) LocalAddr() netip.AddrPort { return l.inner.LocalAddr() }
func (l *Link) WaitWritable() error       { return l.inner.WaitWritable() }
func (l *Link) Close() error              { return l.inner.Close() }

// WaitReadable returns at once while datagrams read are waiting.
func (l *Link) WaitReadable() error {
	if l.left.Load() > 0 {
		return nil
	}
	return l.inner.WaitReadable()
}

// tick turns the answering secret and refills the contact budget (l.mu
// held).
func (l *Link) tick(now time.Time) {
	switch d := now.Sub(l.turned); {
	case d >= 2*l.cfg.SecretLifetime: // both gone: nothing of before can be derived
		l.turn()
		l.turn()
		l.turned = now
	case d >= l.cfg.SecretLifetime:
		l.turn()
		l.turned = l.turned.Add(l.cfg.SecretLifetime)
	}
	for len(l.horder) > 0 {
		k := l.horder[0]
		if o := l.hellos[k]; o != nil && now.Sub(o.at) < 2*l.cfg.SecretLifetime {
			break
		}
		delete(l.hellos, k)
		l.horder = l.horder[1:]
	}
	if d := now.Sub(l.filled); d > 0 {
		l.bucket = min(l.bucket+d.Seconds()*float64(l.cfg.ContactRate), float64(l.cfg.ContactRate))
		l.filled = now
	}
}

// turn draws a new answering secret; the one before it still derives,
// the one before that is gone with the openings it derived (l.mu held).
func (l *Link) turn() {
	l.secret[1], l.secret[0] = l.secret[0], l.random(32)
	l.used[1], l.used[0] = l.used[0], map[opening2]bool{}
}

// spend takes n units of contact work from the budget (l.mu held).
func (l *Link) spend(n float64) bool {
	if l.bucket < n {
		l.st.ContactLimited.Add(1)
		return false
	}
	l.bucket -= n
	return true
}

// ---- Write ----

// Write seals each datagram (a frame with its zero CRC trailer) and
// writes them in one batch below.
func (l *Link) Write(ms []llp.Msg) (int, error) {
	wb := l.batches.Get().(*wbatch)
	defer l.batches.Put(wb)
	out, bufs, iov := &wb.out, &wb.bufs, &wb.iov
	done := 0
	for done < len(ms) {
		n, k := 0, 0
		var werr error
		for ; done+k < len(ms) && n < len(out); k++ {
			m := &ms[done+k]
			if m.Segment > 0 {
				werr = llp.ErrTrains
				break
			}
			bp := l.wpool.Get().(*[]byte)
			b, err := l.seal((*bp)[:0], m)
			if err != nil {
				l.wpool.Put(bp)
				werr = err
				break
			}
			*bp = b
			bufs[n], iov[n][0] = bp, b
			out[n] = llp.Msg{Bufs: iov[n][:], Addr: m.Addr}
			n++
		}
		w := 0
		var err error
		if n > 0 {
			w, err = l.inner.Write(out[:n])
		}
		for i := range n {
			l.wpool.Put(bufs[i])
			bufs[i], iov[i][0], out[i].Bufs = nil, nil, nil
		}
		for i := range w {
			ms[done+i].N = ms[done+i].Len()
		}
		done += w
		if err != nil {
			return done, err
		}
		if werr != nil {
			return done, werr
		}
	}
	return done, nil
}

// wbatch is a Write's scratch: the batch handed to the link below.
type wbatch struct {
	out  [16]llp.Msg
	bufs [16]*[]byte
	iov  [16][1][]byte
}

// seal appends m's datagram, protected, to b.
func (l *Link) seal(b []byte, m *llp.Msg) ([]byte, error) {
	size, first := m.Len(), byte(0)
	for _, p := range m.Bufs {
		if len(p) > 0 {
			first = p[0]
			break
		}
	}
	if size < udiwarp.MinDatagramSize {
		return nil, ErrEnvelope
	}
	frame := size - CRCSize // the trailer above is zero: the tag replaces it
	dst := unmap(m.Addr)
	switch first & 3 {
	case 3:
		if t := reliability.Type(first >> 2); t == reliability.Hello || t == reliability.Challenge {
			for _, p := range m.Bufs {
				b = append(b, p...)
			}
			return l.contact(b[:frame], dst)
		}
	case 0: // a Refuse of ours: sent as it is
		for _, p := range m.Bufs {
			b = append(b, p...)
		}
		return udiwarp.SealDatagram(b[:frame], 0), nil
	}
	var qps uint64
	if first&3 == 3 && len(m.Bufs[0]) >= 12 {
		// An RD frame: the contact of its QP pair may have keys pending.
		h := m.Bufs[0]
		qps = uint64(binary.BigEndian.Uint32(h[8:]))<<32 | uint64(binary.BigEndian.Uint32(h[4:]))
	}
	tx, initial := l.txFor(dst, qps)
	if tx == nil {
		l.st.TxNoKey.Add(1)
		return nil, ErrNoKey
	}
	l.st.Sealed.Add(1)
	return sealFrame(b, m.Bufs, size, tx, initial), nil
}

// sealFrame appends to b the Sealed datagram of the frame bufs hold
// (size bytes with its zero trailer), under tx, with the initial block
// when it is not nil.
func sealFrame(b []byte, bufs [][]byte, size int, tx *sendSA, initial []byte) []byte {
	frame := size - CRCSize
	pn, g := tx.take()
	hs := HeaderSize
	flags := g.phase()
	if initial != nil {
		hs += InitialSize
		flags |= FlagInitial
	}
	if cap(b) < hs+size+TagSize+12 {
		b = make([]byte, 0, hs+size+TagSize+12)
	}
	b = b[:hs]
	for _, p := range bufs {
		b = append(b, p...)
	}
	b = b[:hs+frame]
	clear := frame
	if tx.mode == AEAD {
		clear = headerLen(b[hs:])
	}
	putHeader(b, KindSealed, tx.mode, flags, tx.keyID, pn, clear, initial)
	nonce := (*[12]byte)(b[cap(b)-12 : cap(b)]) // past the tag: a nonce on the stack would escape
	g.nonce(pn, nonce)
	pt := b[hs+clear:]
	g.aead.Seal(pt[:0], nonce[:], pt, b[:hs+clear])
	return b[:hs+frame+TagSize]
}

// txFor is the sender for dst, and the initial block to send with it
// while the peer has not answered under the keys.
func (l *Link) txFor(dst netip.AddrPort, qps uint64) (*sendSA, []byte) {
	m := *l.tx.Load()
	if qps != 0 {
		if p := m[txKey{dst, qps}]; p != nil {
			return p.sa, p.initialBlock()
		}
	}
	if p := m[txKey{addr: dst}]; p != nil && (p.rx != nil || p.sa.pn.Load()&pskCounter < l.cfg.KeyUpdateAfter) {
		return p.sa, p.initialBlock()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := (*l.tx.Load())[txKey{addr: dst}]; p != nil && (p.rx != nil || p.sa.pn.Load()&pskCounter < l.cfg.KeyUpdateAfter) {
		return p.sa, p.initialBlock()
	}
	psk := l.pskFor(dst)
	if psk == nil {
		return nil, nil
	}
	// A pre-shared key's sender: a fresh random key ID, and packet
	// numbers that start at a random 32-bit salt << 32, so that two
	// senders that drew the same key ID (the same key) still never use
	// the same nonce; it moves to a new key ID before its counter
	// reaches KeyUpdateAfter (a key update without generations, which a
	// receiver that restarted could not follow).
	var id uint32
	for id == 0 || l.ownPSK[id] {
		id = binary.BigEndian.Uint32(l.random(4))
	}
	s := newSendSA(id, l.cfg.Mode, 1<<63, pskSecret(psk, l.cfg.Mode, id))
	s.pn.Store(uint64(binary.BigEndian.Uint32(l.random(4))) << 32)
	l.ownPSK[id] = true
	l.setTx(txKey{addr: dst}, &peerTx{sa: s})
	return s, nil
}

// A pre-shared key's sender counts in the low 32 bits of its packet
// numbers (KeyUpdateAfter is at most 2^32) and moves to a new key ID at
// KeyUpdateAfter.
const pskCounter = 1<<32 - 1

func (p *peerTx) initialBlock() []byte {
	if b := p.initial.Load(); b != nil {
		return *b
	}
	return nil
}

// headerLen is how much of a frame travels in clear under AEAD: the RD
// header and the DDP header (the payload alone is encrypted).
func headerLen(f []byte) int {
	off := 0
	if f[0]&3 == 3 {
		var h reliability.Header
		if h.Parse(f) != nil {
			return len(f)
		}
		off = h.Size
	}
	if off >= len(f) {
		return len(f)
	}
	c := udiwarp.DDPControl(f[off])
	n := udiwarp.DDPUntaggedHeaderSize
	switch {
	case c.Tagged() && c.WriteRecord():
		n = udiwarp.WriteRecordHeaderSize
	case c.Tagged():
		n = udiwarp.DDPTaggedHeaderSize
	}
	return min(off+n, len(f))
}

// contact sends an RD Hello or Challenge in a Contact envelope with our
// share: a fresh key for a Hello (kept until its Challenge comes), the
// derived one for a Challenge.
func (l *Link) contact(frame []byte, dst netip.AddrPort) ([]byte, error) {
	var h reliability.Header
	if err := h.Parse(frame); err != nil {
		return nil, err
	}
	var pub []byte
	now := l.cfg.Now()
	l.mu.Lock()
	l.tick(now)
	if h.Type == reliability.Hello {
		k := helloKey{dst, h.Issued}
		o := l.hellos[k]
		if o == nil {
			priv, err := ecdh.X25519().GenerateKey(l.cfg.Rand)
			if err != nil {
				l.mu.Unlock()
				return nil, err
			}
			o = &opening{priv: priv, qp: h.SrcQPN, epoch: h.Epoch}
			if len(l.horder) >= maxHellos {
				delete(l.hellos, l.horder[0])
				l.horder = l.horder[1:]
			}
			l.hellos[k] = o
			l.horder = append(l.horder, k)
		}
		o.at = now
		pub = o.priv.PublicKey().Bytes()
	} else {
		// Answering a Hello (h.Token echoes its token): the key is
		// derived again when the opener's first sealed frame comes. Every
		// Challenge costs an X25519 multiplication, whatever drew it (a
		// Hello, or a Data frame that found no session): budgeted.
		if !l.spend(1) {
			l.mu.Unlock()
			return nil, ErrContactBudget
		}
		pub = answerKey(l.secret[0], dst, h.DstQPN, h.SrcQPN, h.Token).PublicKey().Bytes()
	}
	l.mu.Unlock()
	out := make([]byte, HeaderSize+ShareSize, HeaderSize+ShareSize+len(frame)+CRCSize)
	putHeader(out, KindContact, l.cfg.Mode, FlagShare, 0, 0, len(frame), pub)
	out = append(out, frame...)
	l.st.Contacts.Add(1)
	return udiwarp.SealDatagram(out, 0), nil
}

// ---- Read ----

// Read hands up the datagrams that open, each as its plain frame with a
// zero CRC trailer, and answers or drops the rest.
func (l *Link) Read(ms []llp.Msg) (int, error) {
	if l.pnext == len(l.pend) {
		l.pend, l.pnext = l.pend[:0], 0
		n, err := l.inner.Read(l.rmsgs[:min(len(ms), len(l.rmsgs))])
		if err != nil && n == 0 {
			return 0, err
		}
		l.intake(n)
	}
	k := 0
	for k < len(ms) && l.pnext < len(l.pend) {
		p := &l.pend[l.pnext]
		l.pnext++
		m := &ms[k]
		n := llp.Scatter(m.Bufs, p.b)
		m.N, m.Trunc, m.Segment, m.Addr = n, n < len(p.b), 0, p.src
		m.SetDstFrom(p.m)
		k++
	}
	l.left.Store(int32(len(l.pend) - l.pnext))
	return k, nil
}

// intake opens the n datagrams the last read below returned, queueing
// those to hand up.
func (l *Link) intake(n int) {
	// A coarse clock for the idle reclaim: time.Now costs as much as a
	// seal here, so a busy link reads it every 64 reads (the contact
	// paths read it too).
	if l.reads++; l.reads%64 == 1 {
		l.coarse = l.cfg.Now()
	}
	now := l.coarse
	for i := range n {
		m := &l.rmsgs[i]
		if m.Trunc {
			l.st.BadEnvelope.Add(1)
			continue
		}
		b := l.rbufs[i][:m.N]
		seg := len(b)
		if m.Segment > 0 && m.Segment < len(b) {
			seg = m.Segment
		}
		for len(b) > 0 {
			d := b[:min(seg, len(b))]
			b = b[len(d):]
			if f := l.open(d, unmap(m.Addr), m, now); f != nil {
				l.pend = append(l.pend, pending{b: f, src: unmap(m.Addr), m: m})
			}
		}
	}
}

// open returns the frame a datagram carries, opened, followed by a zero
// CRC trailer (the device above checks none: the tag did), or nil when
// it is refused (counted) or consumed here.
// unicast reports whether m was sent to a unicast address of ours (or
// the link cannot tell): only such a datagram draws an answer.
func unicast(m *llp.Msg) bool {
	if m == nil {
		return true
	}
	_, u, ok := m.Dst()
	return u || !ok
}

func (l *Link) open(b []byte, src netip.AddrPort, m *llp.Msg, now time.Time) []byte {
	if len(b) < udiwarp.MinDatagramSize {
		l.st.BadEnvelope.Add(1)
		return nil
	}
	if b[0]&3 != 0 {
		// Unprotected: a Hello of a peer of today's wire draws a Refuse.
		if unicast(m) {
			l.refuse(b, src)
		}
		l.st.Clear.Add(1)
		return nil
	}
	if b[0] == byte(KindRefuse)<<2 {
		if _, err := udiwarp.OpenDatagram(b); err != nil {
			l.st.BadEnvelope.Add(1)
			return nil
		}
		return b // for the device: it names the QP
	}
	h := &l.rh
	if err := h.Parse(b); err != nil {
		l.st.BadEnvelope.Add(1)
		return nil
	}
	if h.Mode != l.cfg.Mode {
		l.st.ModeMismatch.Add(1)
		if unicast(m) {
			l.refuse(b, src)
		}
		return nil
	}
	if h.Kind == KindContact {
		return l.openContact(b, h, src, unicast(m))
	}
	return l.openSealed(b, h, src, now)
}

// refuse answers datagram b from src with a Refuse, if it is a Hello
// of another mode (RefuseFor).
func (l *Link) refuse(b []byte, src netip.AddrPort) {
	if r := RefuseFor(b, l.cfg.Mode); r != nil {
		if n, _ := l.inner.Write([]llp.Msg{{Bufs: [][]byte{r}, Addr: src}}); n == 1 {
			l.st.RefusesSent.Add(1)
		}
	}
}

// openContact takes a Hello or Challenge in a Contact envelope. A Hello
// goes up as it is (the engine answers it without state, and our
// Challenge gets its derived share on the way out); a Challenge that
// answers a Hello of ours gives the contact's keys, installed before the
// engine sees it.
func (l *Link) openContact(b []byte, h *Header, src netip.AddrPort, unicast bool) []byte {
	f, err := udiwarp.OpenDatagram(b)
	if err != nil {
		l.st.BadEnvelope.Add(1)
		return nil
	}
	f = f[h.Size:]
	up := b[h.Size:] // with its (checked) trailer
	rh := &l.rdh
	if rh.Parse(f) != nil || rh.Type != reliability.Hello && rh.Type != reliability.Challenge {
		l.st.BadEnvelope.Add(1)
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.cfg.Now()
	l.coarse = now
	l.tick(now)
	if rh.Type == reliability.Hello {
		if !unicast {
			return nil
		}
		return up // (its Challenge is budgeted on the way out)
	}
	hk := helloKey{src, rh.Token}
	o := l.hellos[hk]
	if o == nil || o.qp != rh.DstQPN {
		l.st.Unsolicited.Add(1)
		return nil
	}
	// One Challenge per Hello: a copy, or a forgery after it, answers
	// nothing (a resent Hello draws a Challenge the engine takes without
	// new keys: the first one's stand).
	delete(l.hellos, hk)
	if !l.spend(1) {
		return nil
	}
	peer, err := ecdh.X25519().NewPublicKey(h.Share)
	if err != nil {
		l.st.BadEnvelope.Add(1)
		return nil
	}
	dh, err := o.priv.ECDH(peer)
	if err != nil {
		l.st.BadEnvelope.Add(1)
		return nil
	}
	t := &transcript{mode: l.cfg.Mode, openerQP: o.qp, answerQP: rh.SrcQPN, openerEpoch: o.epoch,
		helloToken: rh.Token, keyedTok: rh.Issued, openerShare: o.priv.PublicKey().Bytes(), ansShare: h.Share}
	k := t.derive(dh, l.pskFor(src))
	if r := l.recv[k.idOpen]; r == nil {
		if !l.room(src, now) {
			return nil
		}
		rx := newRecvSA(k.idOpen, l.cfg.Mode, k.r2o, false)
		rx.peer = src
		rx.last.Store(now.UnixNano())
		l.install(rx)
		// Pending: it seals this contact's QP pair's frames only, until
		// the peer answers under it (openSealed promotes it then).
		p := &peerTx{sa: newSendSA(k.idAnswer, l.cfg.Mode, l.cfg.KeyUpdateAfter, k.o2r), rx: rx}
		ib := t.initialBlock()
		p.initial.Store(&ib)
		rx.confirm, rx.pending = p, txKey{src, uint64(o.qp)<<32 | uint64(rh.SrcQPN)}
		l.setTx(rx.pending, p)
		l.st.Sessions.Add(1)
	}
	return up
}

// openSealed opens a Sealed datagram in place and returns its frame.
func (l *Link) openSealed(b []byte, h *Header, src netip.AddrPort, now time.Time) []byte {
	r := l.recv[h.KeyID] // only the reader changes the map (derive, openContact, reclaim: all under Read)
	if r != nil && r.psk && r.epoch != l.pskEpoch.Load() && !l.stillKeyed(r) {
		r = nil // its pre-shared key was removed or replaced
	}
	if r == nil {
		// Keys we do not hold: derived, installed only if it opens.
		if !l.derive(b, h, src) {
			return nil
		}
	} else {
		if r.peer != src {
			// Keys belong to the address they were agreed or first
			// used with: an authentic datagram from elsewhere is a copy
			// (a UD completion would name the forged source).
			l.st.WrongSource.Add(1)
			return nil
		}
		if !r.win.check(h.PN) {
			l.st.Replayed.Add(1)
			return nil
		}
		g := r.genFor(h.PN, h.Flags&FlagPhase)
		if g == nil || !openIn(g, b, h, &l.nonce) {
			l.st.AuthFailed.Add(1)
			return nil
		}
		if g == r.next {
			l.st.KeyUpdates.Add(1)
		}
		r.opened(g, h.PN)
		r.last.Store(now.UnixNano())
		l.st.Opened.Add(1)
		if c := r.confirm; c != nil && h.Flags&FlagInitial == 0 {
			// The peer answered under the keys: it holds them. They seal
			// everything to its address from now on.
			c.initial.Store(nil)
			r.confirm = nil
			l.mu.Lock()
			l.setTx(r.pending, nil)
			l.setTx(txKey{addr: r.peer}, c)
			l.mu.Unlock()
		}
	}
	end := len(b) - TagSize
	clear(b[end : end+CRCSize])
	return b[h.Size : end+CRCSize]
}

// openIn opens b's frame in place under g, with nonce as scratch.
func openIn(g *gen, b []byte, h *Header, nonce *[12]byte) bool {
	g.nonce(h.PN, nonce)
	ct := b[h.Size+h.ClearLen:]
	_, err := g.aead.Open(ct[:0], nonce[:], ct, b[:h.Size+h.ClearLen])
	return err == nil
}

// derive finds the keys of a Sealed datagram under a key ID we do not
// hold — from its initial block (a contact we answered without state)
// or from the pre-shared key of its source — and installs them if, and
// only if, the datagram opens under them (it is open then).
func (l *Link) derive(b []byte, h *Header, src netip.AddrPort) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.cfg.Now()
	l.coarse = now
	l.tick(now)
	var r *recvSA
	var tx *peerTx
	usedIn := -1
	var op opening2
	if h.Flags&FlagInitial != 0 {
		t := parseInitial(h.Share, l.cfg.Mode)
		peer, err := ecdh.X25519().NewPublicKey(t.openerShare)
		if err != nil {
			l.st.BadEnvelope.Add(1)
			return false
		}
		op = opening2{src, t.helloToken, t.openerQP, t.answerQP}
		if l.used[0][op] || l.used[1][op] {
			// Derived before: its keys were reclaimed since, and this is
			// a copy of its first frame (a replay, or a retransmission
			// too late). Never again: its packet numbers would restart.
			l.st.Replayed.Add(1)
			return false
		}
		for i, sec := range l.secret {
			if !l.spend(2) {
				return false
			}
			priv := answerKey(sec, src, t.openerQP, t.answerQP, t.helloToken)
			dh, err := priv.ECDH(peer)
			if err != nil {
				break
			}
			t.ansShare = priv.PublicKey().Bytes()
			k := t.derive(dh, l.pskFor(src))
			if k.idAnswer != h.KeyID {
				continue
			}
			r = newRecvSA(k.idAnswer, l.cfg.Mode, k.o2r, false)
			tx = &peerTx{sa: newSendSA(k.idOpen, l.cfg.Mode, l.cfg.KeyUpdateAfter, k.r2o), rx: r}
			usedIn = i
			break
		}
	} else if psk := l.pskFor(src); psk != nil {
		if l.ownPSK[h.KeyID] {
			l.st.Reflected.Add(1)
			return false
		}
		if l.retired[retiredKey{src, h.KeyID}] {
			l.st.Replayed.Add(1) // a key ID its sender left behind: its datagrams are old
			return false
		}
		if !l.spend(0.25) {
			return false
		}
		r = newRecvSA(h.KeyID, l.cfg.Mode, pskSecret(psk, l.cfg.Mode, h.KeyID), true)
		r.epoch = l.pskEpoch.Load()
	}
	if r == nil {
		l.st.NoKey.Add(1)
		return false
	}
	g := r.genFor(h.PN, h.Flags&FlagPhase)
	if g == nil || !openIn(g, b, h, &l.nonce) {
		l.st.AuthFailed.Add(1)
		return false
	}
	if !l.room(src, now) {
		return false
	}
	r.opened(g, h.PN)
	r.last.Store(now.UnixNano())
	r.peer = src
	l.install(r)
	if usedIn >= 0 {
		l.used[usedIn][op] = true
		if len(l.used[0]) >= l.cfg.MaxPeers {
			l.turn() // full: the openings of two secrets ago can no longer be derived
			l.turned = now
		}
	}
	if tx != nil {
		l.setTx(txKey{addr: src}, tx)
		l.st.Sessions.Add(1)
	} else {
		l.st.PSKPeers.Add(1)
		if ks := append(l.pskRx[src], r); len(ks) > 2 {
			l.retire(ks[0])
			l.pskRx[src] = ks[1:]
		} else {
			l.pskRx[src] = ks
		}
	}
	l.st.Opened.Add(1)
	return true
}

// room reports whether a receive key for src may be installed: under
// MaxPerAddr for its address, and under MaxPeers once idle keys are
// reclaimed (l.mu held).
func (l *Link) room(src netip.AddrPort, now time.Time) bool {
	if l.perAddr[src.Addr()] >= MaxPerAddr || len(l.recv) >= l.cfg.MaxPeers && !l.reclaim(now) {
		l.st.PeersFull.Add(1)
		return false
	}
	return true
}

// install adds r to the receive keys (l.mu held).
func (l *Link) install(r *recvSA) {
	l.recv[r.keyID] = r
	l.perAddr[r.peer.Addr()]++
}

// remove drops r and whatever seals with its keys (l.mu held).
func (l *Link) remove(r *recvSA) {
	delete(l.recv, r.keyID)
	if r.psk {
		ks := l.pskRx[r.peer]
		for i, k := range ks {
			if k == r {
				ks = append(ks[:i:i], ks[i+1:]...)
				break
			}
		}
		if len(ks) == 0 {
			delete(l.pskRx, r.peer)
		} else {
			l.pskRx[r.peer] = ks
		}
	}
	if l.perAddr[r.peer.Addr()]--; l.perAddr[r.peer.Addr()] <= 0 {
		delete(l.perAddr, r.peer.Addr())
	}
	for k, p := range *l.tx.Load() {
		if p.rx == r {
			l.setTx(k, nil)
		}
	}
}

// retire drops pre-shared-key receive key r for good (l.mu held).
func (l *Link) retire(r *recvSA) {
	k := retiredKey{r.peer, r.keyID}
	if len(l.rorder) >= maxRetired {
		delete(l.retired, l.rorder[0])
		l.rorder = l.rorder[1:]
	}
	l.retired[k] = true
	l.rorder = append(l.rorder, k)
	l.remove(r)
}

// reclaim drops receive keys idle for IdleTimeout and reports whether
// there is room for one more (l.mu held).
func (l *Link) reclaim(now time.Time) bool {
	idle := now.Add(-l.cfg.IdleTimeout).UnixNano()
	for _, r := range l.recv {
		if r.last.Load() < idle {
			l.remove(r)
		}
	}
	return len(l.recv) < l.cfg.MaxPeers
}

// stillKeyed reports whether PSK receive key r is still what its peer's
// pre-shared key gives, after a SetPeerKey; if not it is dropped (the
// reader, l.mu taken).
func (l *Link) stillKeyed(r *recvSA) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	psk := l.pskFor(r.peer)
	if psk != nil && bytes.Equal(pskSecret(psk, r.mode, r.keyID), r.secret0[:]) {
		r.epoch = l.pskEpoch.Load()
		return true
	}
	l.remove(r)
	return false
}
