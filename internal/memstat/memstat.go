// Package memstat measures memory the way seed 003 measured its SIPp
// runs: the whole process (resident set, not only the Go heap) plus the
// kernel slab its sockets use. It reads Linux's /proc: VmRSS from
// /proc/PID/status, and the slab caches from /proc/slabinfo (root only on
// most kernels) with /proc/meminfo's Slab total beside them, because SLUB
// merges small caches and some socket memory lands in merged ones.
//
// A measurement is a difference: take a Slab before the sockets exist
// and one while they do, and Sub them.
package memstat

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// RSS returns the resident set size of process pid in bytes (VmRSS).
func RSS(pid int) (int64, error) {
	return statusField(pid, "VmRSS:")
}

// HWM returns the peak resident set size of process pid in bytes (VmHWM).
func HWM(pid int) (int64, error) {
	return statusField(pid, "VmHWM:")
}

func statusField(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return kBField(b, field)
}

// kBField parses a "Name:   1234 kB" line of a /proc file.
func kBField(b []byte, field string) (int64, error) {
	for line := range bytes.Lines(b) {
		if rest, ok := bytes.CutPrefix(line, []byte(field)); ok {
			f := strings.Fields(string(rest))
			if len(f) == 0 {
				break
			}
			v, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("memstat: %s %q: %w", field, rest, err)
			}
			if len(f) > 1 && f[1] == "kB" {
				v <<= 10
			}
			return v, nil
		}
	}
	return 0, fmt.Errorf("memstat: no %s field", field)
}

// SocketCaches are the slab caches that hold sockets themselves (struct
// sock per protocol and the socket inode). Buffered packets are counted
// by the kernel elsewhere (skbuff heads in their cache, data in page
// fragments), so a Slab's Sockets sum is what a socket costs at rest.
var SocketCaches = []string{"UDP", "UDPv6", "TCP", "TCPv6", "RAW", "RAWv6", "UDP-Lite", "UDPLITEv6",
	"sock_inode_cache", "request_sock_TCP", "request_sock_TCPv6", "tw_sock_TCP", "tw_sock_TCPv6",
	"skbuff_head_cache", "skbuff_fclone_cache", "skbuff_small_head", "eventpoll_epi", "eventpoll_pwq", "filp"}

// Slab is one reading of the kernel's slab: bytes per cache (objects
// allocated times object size) and /proc/meminfo's Slab total.
type Slab struct {
	Caches map[string]int64
	Total  int64
}

// ReadSlab reads /proc/slabinfo and /proc/meminfo.
func ReadSlab() (Slab, error) {
	s := Slab{Caches: map[string]int64{}}
	f, err := os.Open("/proc/slabinfo")
	if err != nil {
		return s, fmt.Errorf("memstat: %w (slabinfo is readable by root only)", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "slabinfo") || strings.HasPrefix(line, "#") {
			continue
		}
		// name active_objs num_objs objsize objperslab pagesperslab : ...
		fs := strings.Fields(line)
		if len(fs) < 4 {
			continue
		}
		num, err1 := strconv.ParseInt(fs[2], 10, 64)
		size, err2 := strconv.ParseInt(fs[3], 10, 64)
		if err1 != nil || err2 != nil {
			return s, fmt.Errorf("memstat: slabinfo line %q", line)
		}
		s.Caches[fs[0]] = num * size
	}
	if err := sc.Err(); err != nil {
		return s, err
	}
	mi, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return s, err
	}
	s.Total, err = kBField(mi, "Slab:")
	return s, err
}

// Sub returns s minus earlier, cache by cache.
func (s Slab) Sub(earlier Slab) Slab {
	d := Slab{Caches: make(map[string]int64, len(s.Caches)), Total: s.Total - earlier.Total}
	for k, v := range s.Caches {
		d.Caches[k] = v - earlier.Caches[k]
	}
	for k, v := range earlier.Caches {
		if _, ok := s.Caches[k]; !ok {
			d.Caches[k] = -v
		}
	}
	return d
}

// Sockets sums the SocketCaches present.
func (s Slab) Sockets() int64 {
	var n int64
	for _, c := range SocketCaches {
		n += s.Caches[c]
	}
	return n
}
