package qp

import (
	"crypto/rand"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/udiwarp/udiwarp/udiwarp"
	"github.com/udiwarp/udiwarp/validitymap"
	"github.com/udiwarp/udiwarp/writerecord"
	"unsafe"
)

// Access is the set of rights a memory region grants.
type Access uint8

const (
	AccessLocalWrite  Access = 1 << iota // receives and Read Responses may write it
	AccessRemoteWrite                    // peers may RDMA Write / Write-Record into it
	AccessRemoteRead                     // peers may RDMA Read it
)

func (a Access) String() string {
	s := ""
	for _, f := range []struct {
		bit  Access
		name string
	}{{AccessLocalWrite, "local-write"}, {AccessRemoteWrite, "remote-write"}, {AccessRemoteRead, "remote-read"}} {
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
// is a 24-bit table index and an 8-bit key that is random and differs on
// every registration, so a stale STag never reaches new memory.
type MR struct {
	pd     *PD
	buf    []byte
	base   uint64 // the region's address space starts here (its first byte's address)
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
	// revoked: a peer's Send with Invalidate ended remote access (RC).
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
// in region offsets (TO - Addr()); limit bounds its disjoint ranges
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

// Addr is the address of the region's first byte: SGE addresses and
// tagged offsets are in this space, as in verbs.
func (m *MR) Addr() uint64 { return m.base }

// Len is the region's length in bytes.
func (m *MR) Len() int { return len(m.buf) }

// Access returns the rights the region grants.
func (m *MR) Access() Access { return m.access }

// Bytes returns the registered buffer.
func (m *MR) Bytes() []byte { return m.buf }

// SGE returns a scatter-gather element for buf[off : off+n].
func (m *MR) SGE(off, n int) SGE {
	return SGE{Addr: m.base + uint64(off), Length: uint32(n), LKey: m.stag}
}

// SGE is one piece of a scatter-gather list: Length bytes at address Addr
// of the region whose lkey is LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// mrTable maps STag indexes to regions. Lookups are lock-free.
type mrTable struct {
	mu      sync.Mutex // serializes allocation
	slots   []atomic.Pointer[MR]
	lastKey []uint8
	next    uint32
	used    int
}

func newMRTable(n int) *mrTable {
	return &mrTable{slots: make([]atomic.Pointer[MR], n+1), lastKey: make([]uint8, n+1), next: 1}
}

// lookup returns the valid region whose STag is stag, or nil.
func (t *mrTable) lookup(stag uint32) *MR {
	i := stag >> 8
	if i == 0 || int(i) >= len(t.slots) {
		return nil
	}
	m := t.slots[i].Load()
	if m == nil || m.stag != stag {
		return nil
	}
	return m
}

// RegisterMemory registers buf with the given access rights (ibv_reg_mr).
// The buffer must not be empty. Remote write and remote read are granted
// only with local write, as verbs require for remote write.
func (pd *PD) RegisterMemory(buf []byte, access Access) (*MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("%w: RegisterMemory of an empty buffer", ErrInvalidAttr)
	}
	if access&AccessRemoteWrite != 0 && access&AccessLocalWrite == 0 {
		return nil, fmt.Errorf("%w: remote write access needs local write access (access %v)", ErrInvalidAttr, access)
	}
	d := pd.dev
	if d.closed.Load() {
		return nil, ErrClosed
	}
	t := d.mrs
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.used >= len(t.slots)-1 {
		return nil, fmt.Errorf("%w: %d memory regions registered", ErrTooMany, t.used)
	}
	for t.slots[t.next].Load() != nil {
		t.next++
		if int(t.next) >= len(t.slots) {
			t.next = 1
		}
	}
	idx := t.next
	t.next++
	if int(t.next) >= len(t.slots) {
		t.next = 1
	}
	m := &MR{pd: pd, buf: buf, base: uint64(uintptr(unsafe.Pointer(&buf[0]))), access: access}
	m.valid.Store(true)
	// A fresh key, never the one this index had last, so a stale STag
	// cannot reach the new region.
	var key [1]byte
	for {
		_, _ = rand.Read(key[:])
		if key[0] != t.lastKey[idx] {
			break
		}
	}
	t.lastKey[idx] = key[0]
	m.stag = idx<<8 | uint32(key[0])
	t.slots[idx].Store(m)
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
	i := m.stag >> 8
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
	for m.pins.Load() != 0 { // copies in progress finish; no new one starts
		runtime.Gosched()
	}
	return nil
}

// resolve checks an SGE against the QP's PD and the access it needs and
// returns the region, pinned, and the byte range. The caller must
// m.unpin() when its copy is done.
func (d *Device) resolve(pd *PD, s *SGE, need Access) (*MR, []byte, Status) {
	m := d.mrs.lookup(s.LKey)
	if m == nil || m.pd != pd || m.access&need != need {
		return nil, nil, LocalProtectionError
	}
	off := s.Addr - m.base
	if s.Addr < m.base || off > uint64(len(m.buf)) || uint64(s.Length) > uint64(len(m.buf))-off {
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
)

// remoteRegion checks a peer's access to n bytes at tagged offset to of
// region stag — the STag and its key, the PD, the access (not revoked by
// a Send with Invalidate), bounds without wrap: RFC 5040 §7.2 — and
// returns the region pinned (the caller unpins), or why not, counted.
// Every remote access goes through it: placement of Writes and Read
// Responses, and the source of Read Responses, on RD and RC QPs.
func (d *Device) remoteRegion(pd *PD, stag uint32, to, n uint64, need Access) (*MR, tagFault) {
	st := &d.stats
	m := d.mrs.lookup(stag)
	switch {
	case m == nil:
		st.RxBadSTag.Add(1)
		return nil, faultSTag
	case m.pd != pd:
		st.RxBadSTag.Add(1)
		return nil, faultPD
	case m.access&need != need || m.revoked.Load():
		st.RxAccess.Add(1)
		return nil, faultAccess
	case to < m.base || to-m.base > uint64(len(m.buf)) || n > uint64(len(m.buf))-(to-m.base):
		st.RxBounds.Add(1)
		return nil, faultBounds
	}
	m.pins.Add(1)
	if !m.valid.Load() {
		m.unpin()
		st.RxBadSTag.Add(1)
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
	copy(m.buf[to-m.base:], payload)
	m.unpin()
	return 0, true
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
