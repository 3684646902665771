package qp

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/udiwarp/udiwarp/udiwarp"
	"github.com/udiwarp/udiwarp/validitymap"
	"github.com/udiwarp/udiwarp/writerecord"
)

// Access is the set of rights a memory region grants.
type Access uint8

const (
	AccessLocalWrite  Access = 1 << iota // receives and Read Responses may write it
	AccessRemoteWrite                    // peers may RDMA Write / Write-Record into it
	AccessRemoteRead                     // peers may RDMA Read it
	// AccessRemoteInvalidate lets a peer's Send with Invalidate (RC QPs)
	// end remote access to the region. Without it such a Send is refused
	// with the RDMAP remote protection error "STag cannot be invalidated"
	// and the STag keeps working (RFC 5040 §6.4; verbs: remote
	// invalidation only of what was registered for it).
	AccessRemoteInvalidate
	// AccessRemoteAtomic lets peers run RFC 7306 atomics (FetchAdd,
	// CmpSwap) on the region's 8-byte-aligned 64-bit words (RD and RC
	// QPs). Like remote write it needs local write.
	AccessRemoteAtomic
)

func (a Access) String() string {
	s := ""
	for _, f := range []struct {
		bit  Access
		name string
	}{{AccessLocalWrite, "local-write"}, {AccessRemoteWrite, "remote-write"}, {AccessRemoteRead, "remote-read"},
		{AccessRemoteInvalidate, "remote-invalidate"}, {AccessRemoteAtomic, "remote-atomic"}} {
		if a&f.bit != 0 {
			if s != "" {
				s += "|"
			}
			s += f.name
		}
	}
	if s == "" {
		return "local-read"
	}
	return s
}

// PD is a protection domain: MRs, QPs and AHs of one PD work together only.
type PD struct {
	dev *Device
	id  uint32
}

// MR is a registered memory region. Its STag (both the lkey and the rkey)
// is a 24-bit index and an 8-bit key, all 32 bits drawn at random on
// every registration (mrTable), so a stale STag never reaches new memory
// and an off-path sender cannot predict one. The region is zero-based:
// tagged offsets and SGE addresses are byte offsets into it, from 0
// (Addr), never the buffer's address in memory.
type MR struct {
	pd     *PD
	buf    []byte
	stag   uint32
	access Access
	// pins counts the copies into or out of buf in progress; Deregister
	// clears valid and then waits for pins to drain, so it returns only
	// once no copy can still be running. A pin, unlike a read lock, may be
	// taken twice by one copy (two SGEs of one region) without deadlock.
	pins  atomic.Int64
	valid atomic.Bool
	// rdRefs counts the RD and RC work requests whose data, not yet
	// acknowledged or sent, lives here: the buffer is their source (seed 002).
	rdRefs atomic.Int32
	// revoked: remote access has ended, by a peer's Send with Invalidate
	// (RC, AccessRemoteInvalidate) or by Invalidate. Nothing clears it: a
	// revoked STag stays revoked until the memory is registered again,
	// under a new STag.
	revoked atomic.Bool
	vmap    atomic.Pointer[validitymap.Map]
	// wrLimits overrides the receiving QP's Write-Record deadline and
	// policy for messages into this region.
	wrLimits atomic.Pointer[writerecord.Limits]
}

// SetWriteRecordLimits gives Write-Record messages into this region their
// own deadline and partial-message policy, overriding those of the QP
// that receives them (QPAttr.WriteRecord); nil restores the QP's. It
// applies to messages whose first segment arrives afterwards.
func (m *MR) SetWriteRecordLimits(l *writerecord.Limits) {
	if l != nil {
		c := *l
		l = &c
	}
	m.wrLimits.Store(l)
}

// TrackValidity gives the region a validity map (seed 003's second
// recording design) that Write-Record messages arriving for it update,
// in region offsets (the tagged offsets themselves: regions are
// zero-based); limit bounds its disjoint ranges
// (validitymap.DefaultLimit when <= 0). It returns the map; calling it
// again returns the same one.
func (m *MR) TrackValidity(limit int) *validitymap.Map {
	if v := m.vmap.Load(); v != nil {
		return v
	}
	m.vmap.CompareAndSwap(nil, validitymap.New(limit))
	return m.vmap.Load()
}

// ValidityMap returns the region's validity map, or nil.
func (m *MR) ValidityMap() *validitymap.Map { return m.vmap.Load() }

// unpin ends a copy begun by Device.resolve.
func (m *MR) unpin() { m.pins.Add(-1) }

// STag returns the steering tag, used as lkey in SGEs and as rkey by peers.
func (m *MR) STag() uint32 { return m.stag }

// LKey and RKey are the STag under the names verbs users know.
func (m *MR) LKey() uint32 { return m.stag }
func (m *MR) RKey() uint32 { return m.stag }

// Addr is the address of the region's first byte in the space SGE
// addresses and tagged offsets use. Regions are zero-based (as verbs'
// IBV_ACCESS_ZERO_BASED): it is always 0, and a tagged offset is a byte
// offset into the region, which tells a peer nothing about the process's
// memory and gives an off-path sender nothing to guess beyond the STag
// (docs/verbs.md, "Remote access").
func (m *MR) Addr() uint64 { return 0 }

// Len is the region's length in bytes.
func (m *MR) Len() int { return len(m.buf) }

// Access returns the rights the region grants.
func (m *MR) Access() Access { return m.access }

// Bytes returns the registered buffer.
func (m *MR) Bytes() []byte { return m.buf }

// SGE returns a scatter-gather element for buf[off : off+n].
func (m *MR) SGE(off, n int) SGE {
	return SGE{Addr: uint64(off), Length: uint32(n), LKey: m.stag}
}

// SGE is one piece of a scatter-gather list: Length bytes at address Addr
// of the region whose lkey is LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// mrTable maps STags to regions. Lookups are lock-free and O(1): the
// low bits of an STag's 24-bit index name the slot (mask), and the region
// there answers only to its whole STag. Allocation draws the slot at
// random among the free ones and the index's high bits and the 8-bit key
// at random too, so an STag is a random 32-bit value: successive
// registrations are unrelated, and an off-path sender that knows N STags
// are registered hits one with probability N/2^32 per guess.
type mrTable struct {
	mu       sync.Mutex // serializes allocation
	slots    []atomic.Pointer[MR]
	lastSTag []uint32 // the STag each slot had last, never given again next
	mask     uint32   // len(slots)-1: a power of two less one
	max      int      // regions at most (DeviceConfig.MaxMR)
	used     int
}

func newMRTable(n int) *mrTable {
	size := 2 // slot 0 is never used: index 0 is no STag
	for size < n+1 {
		size <<= 1
	}
	return &mrTable{slots: make([]atomic.Pointer[MR], size), lastSTag: make([]uint32, size), mask: uint32(size - 1), max: n}
}

// slot is the slot an STag names.
func (t *mrTable) slot(stag uint32) uint32 { return stag >> 8 & t.mask }

// lookup returns the valid region whose STag is stag, or nil.
func (t *mrTable) lookup(stag uint32) *MR {
	m := t.slots[t.slot(stag)].Load()
	if m == nil || m.stag != stag {
		return nil
	}
	return m
}

// allocLocked picks a free slot at random and a random STag for it that
// is not the one the slot had last. The caller holds mu and has checked
// that a slot is free.
func (t *mrTable) allocLocked() (uint32, uint32) {
	var r [8]byte
	_, _ = rand.Read(r[:])
	x := binary.LittleEndian.Uint64(r[:])
	i := uint32(x) & t.mask
	// A few random probes find a free slot unless the table is nearly
	// full; then the scan from the last probe does.
	for tries := 0; i == 0 || t.slots[i].Load() != nil; tries++ {
		if tries < 8 {
			_, _ = rand.Read(r[:4])
			i = binary.LittleEndian.Uint32(r[:4]) & t.mask
		} else {
			i = (i + 1) & t.mask
		}
	}
	for {
		stag := uint32(x>>32)&^(t.mask<<8) | i<<8
		if stag != t.lastSTag[i] {
			t.lastSTag[i] = stag
			return i, stag
		}
		_, _ = rand.Read(r[:])
		x = binary.LittleEndian.Uint64(r[:])
	}
}

// RegisterMemory registers buf with the given access rights (ibv_reg_mr).
// The buffer must not be empty. Remote write and remote read are granted
// only with local write, as verbs require for remote write.
func (pd *PD) RegisterMemory(buf []byte, access Access) (*MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("%w: RegisterMemory of an empty buffer", ErrInvalidAttr)
	}
	if access&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && access&AccessLocalWrite == 0 {
		return nil, fmt.Errorf("%w: remote write and remote atomic access need local write access (access %v)", ErrInvalidAttr, access)
	}
	d := pd.dev
	if d.closed.Load() {
		return nil, ErrClosed
	}
	t := d.mrs
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.used >= t.max {
		return nil, fmt.Errorf("%w: %d memory regions registered", ErrTooMany, t.used)
	}
	i, stag := t.allocLocked()
	m := &MR{pd: pd, buf: buf, stag: stag, access: access}
	m.valid.Store(true)
	t.slots[i].Store(m)
	t.used++
	return m, nil
}

// Deregister removes the region (ibv_dereg_mr). It returns once no
// placement into or copy out of the buffer can still happen; after that
// the buffer is the caller's again. WRs still naming the region complete
// with LocalProtectionError. It returns ErrBusy while one of the owner's
// own RD or RC WRs not yet acknowledged sends from the region; Read
// Responses an RD QP is sending from it to a peer do not hold it: they
// are cut short and the peer's Read fails (docs/verbs.md).
func (m *MR) Deregister() error {
	t := m.pd.dev.mrs
	t.mu.Lock()
	i := t.slot(m.stag)
	if t.slots[i].Load() != m {
		t.mu.Unlock()
		return fmt.Errorf("%w: MR with STag %#08x is not registered", ErrNotFound, m.stag)
	}
	if m.rdRefs.Load() > 0 {
		// A peer's Read does not hold the region: its responses are cut
		// short (the requester's Read fails); the owner's own WRs do.
		m.pd.dev.rdCutReads(m)
	}
	if n := m.rdRefs.Load(); n > 0 {
		t.mu.Unlock()
		return fmt.Errorf("%w: MR with STag %#08x: %d work requests not yet acknowledged send from it", ErrBusy, m.stag, n)
	}
	t.slots[i].Store(nil)
	t.used--
	t.mu.Unlock()
	m.valid.Store(false)
	m.drain()
	return nil
}

// drain waits until no copy into or out of the region that began before
// is still running.
func (m *MR) drain() {
	for m.pins.Load() != 0 {
		runtime.Gosched()
	}
}

// Invalidate ends remote access to the region at once, as a peer's Send
// with Invalidate would (a local invalidate, for the region's owner):
// once it returns, no tagged Write, Write-Record or Read Request naming
// the STag is served, no byte is placed into the region or read out of it
// for a peer, and Read Responses not yet sent from it go out empty, so
// the peer's Read fails (docs/wire.md §11). It is for good: the STag
// stays revoked until the memory is registered again. Local use (SGEs)
// goes on; Deregister frees the region once no work request needs it.
func (m *MR) Invalidate() {
	m.revoked.Store(true)
	m.drain()
}

// resolve checks an SGE against the QP's PD and the access it needs and
// returns the region, pinned, and the byte range. The caller must
// m.unpin() when its copy is done.
func (d *Device) resolve(pd *PD, s *SGE, need Access) (*MR, []byte, Status) {
	m := d.mrs.lookup(s.LKey)
	if m == nil || m.pd != pd || m.access&need != need {
		return nil, nil, LocalProtectionError
	}
	off := s.Addr // regions are zero-based
	if off > uint64(len(m.buf)) || uint64(s.Length) > uint64(len(m.buf))-off {
		return nil, nil, LocalProtectionError
	}
	m.pins.Add(1)
	if !m.valid.Load() {
		m.unpin()
		return nil, nil, LocalProtectionError
	}
	return m, m.buf[off : off+uint64(s.Length)], Success
}

// tagFault is why a peer's access to a tagged region was refused.
type tagFault uint8

const (
	faultNone   tagFault = iota
	faultSTag            // no such region, a stale key, or deregistered
	faultPD              // a region of another protection domain
	faultAccess          // the access is not granted, or was revoked
	faultBounds          // [to, to+n) is not inside the region
	faultAlign           // an atomic's word is not 8 bytes at an 8-byte-aligned address
)

// remoteRegion checks a peer's access to n bytes at tagged offset to of
// region stag — the STag and its key, the PD, the access (not revoked),
// bounds without wrap: RFC 5040 §7.2 — and returns the region pinned (the
// caller unpins), or why not, counted. It is the one check of remote
// access: every tagged placement (RDMA Write, Read Response, Write-Record
// on UD, RD and RC QPs, the Write-Record landing path) and every tagged
// read (a Read Request, and each Read Response segment as it is sent)
// and every atomic (need AccessRemoteAtomic: the word must also be 8
// bytes at an 8-byte-aligned address of the buffer, RFC 7306) goes
// through it or, where nothing was received to count, checkRemote.
func (d *Device) remoteRegion(pd *PD, stag uint32, to, n uint64, need Access) (*MR, tagFault) {
	m, f := d.checkRemote(pd, stag, to, n, need)
	st := &d.stats
	switch f {
	case faultSTag, faultPD:
		st.RxBadSTag.Add(1)
	case faultAccess:
		st.RxAccess.Add(1)
	case faultBounds:
		st.RxBounds.Add(1)
	case faultAlign:
		st.RxMisaligned.Add(1)
	}
	return m, f
}

// checkRemote is remoteRegion without the counting, for a check that no
// received segment asked for: a Read Response about to be sent, a place
// the landing path prepares.
func (d *Device) checkRemote(pd *PD, stag uint32, to, n uint64, need Access) (*MR, tagFault) {
	m := d.mrs.lookup(stag)
	switch {
	case m == nil:
		return nil, faultSTag
	case m.pd != pd:
		return nil, faultPD
	case m.access&need != need || m.revoked.Load():
		return nil, faultAccess
	case to > uint64(len(m.buf)) || n > uint64(len(m.buf))-to: // zero-based
		return nil, faultBounds
	case need&AccessRemoteAtomic != 0 && (n != 8 || (uintptr(unsafe.Pointer(unsafe.SliceData(m.buf)))+uintptr(to))&7 != 0):
		return nil, faultAlign
	}
	m.pins.Add(1)
	if !m.valid.Load() || m.revoked.Load() { // deregistered or revoked meanwhile: Deregister and Invalidate drain pins
		m.unpin()
		if m.revoked.Load() {
			return nil, faultAccess
		}
		return nil, faultSTag
	}
	return m, faultNone
}

// ddpCode is a tagFault as RFC 5041 reports it for a tagged segment.
func (f tagFault) ddpCode() udiwarp.ErrorCode {
	switch f {
	case faultPD:
		return udiwarp.DDPTaggedSTagNotAssociated
	case faultBounds:
		return udiwarp.DDPTaggedBaseBounds
	}
	return udiwarp.DDPTaggedInvalidSTag
}

// rdmapCode is a tagFault as RFC 5040 reports it for a Read Request's
// source.
func (f tagFault) rdmapCode() udiwarp.ErrorCode {
	switch f {
	case faultPD:
		return udiwarp.RDMAPSTagNotAssociated
	case faultAccess:
		return udiwarp.RDMAPAccessRights
	case faultBounds:
		return udiwarp.RDMAPBaseBounds
	case faultAlign:
		// RFC 7306 names no code for a misaligned atomic: remote
		// operation error, unspecified (docs/wire.md §6.3).
		return udiwarp.RDMAPOpUnspecified
	}
	return udiwarp.RDMAPInvalidSTag
}

// placeTagged places a tagged segment's payload into the region it names
// (remoteRegion's checks) and returns the DDP tagged error code of a
// refusal; ok means placed. A zero-length segment needs no valid STag
// (RFC 5042 §6.3.5).
func (d *Device) placeTagged(pd *PD, stag uint32, to uint64, payload []byte, need Access) (udiwarp.ErrorCode, bool) {
	if len(payload) == 0 {
		return 0, true
	}
	m, f := d.remoteRegion(pd, stag, to, uint64(len(payload)), need)
	if f != faultNone {
		return f.ddpCode(), false
	}
	copy(m.buf[to:], payload)
	m.unpin()
	return 0, true
}

// pinRemote is pin for the source of a Read Response: the peer's
// remote-read access to it, checked (checkRemote) as each segment is
// built, so a region invalidated under a Read gives no more bytes.
func (t *txCtx) pinRemote(g *SGE) ([]byte, Status) {
	m, f := t.q.dev.checkRemote(t.q.pd, g.LKey, g.Addr, uint64(g.Length), AccessRemoteRead)
	if f != faultNone {
		t.release()
		return nil, RemoteAccessError
	}
	t.mrs[t.nmr] = m
	t.nmr++
	return m.buf[g.Addr : g.Addr+uint64(g.Length)], Success
}

// mrRefs holds the regions a send WR's data lives in: each referenced
// (MR.rdRefs), so that none is deregistered before the WR completes.
type mrRefs struct {
	mrs [maxSGE]*MR
	n   int
}

// take references the region of every SGE of sgl, checked against pd and
// need; on a fault it lets go of what it took and returns the status.
func (r *mrRefs) take(d *Device, pd *PD, sgl []SGE, need Access) Status {
	for i := range sgl {
		m, _, st := d.resolve(pd, &sgl[i], need)
		if st != Success {
			r.release()
			return st
		}
		r.add(m)
		m.unpin()
	}
	return Success
}

// add references m.
func (r *mrRefs) add(m *MR) {
	m.rdRefs.Add(1)
	r.mrs[r.n] = m
	r.n++
}

// release lets go of every region.
func (r *mrRefs) release() {
	for i := 0; i < r.n; i++ {
		r.mrs[i].rdRefs.Add(-1)
		r.mrs[i] = nil
	}
	r.n = 0
}
