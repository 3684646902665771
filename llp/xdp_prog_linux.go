package llp

// The XDP program an XDP link attaches to its interface, assembled here
// (no C compiler, no object file). It redirects to the link's AF_XDP
// socket only the UDP datagrams addressed to one of the link's
// address:port pairs, and passes everything else to the kernel:
//
//	Ethernet, at most one 802.1Q tag
//	IPv4 (any IHL; not a fragment) or IPv6 (next header UDP, no
//	extension headers)
//	UDP: key {destination address as 16 bytes (IPv4 mapped), destination
//	port} in the ports map -> bpf_redirect_map(xsks, rx_queue_index,
//	XDP_PASS)
//
// The redirect falls back to XDP_PASS when no socket serves the queue the
// frame came in on: the datagram then reaches the kernel socket the link
// holds on its port, which Read also drains.

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// xdpProgName is how RemoveStaleXDP recognises the program (the kernel
// keeps 15 bytes of a name).
const xdpProgName = "udiwarp_xdp"

// xdpKeyLen is the length of a ports-map key: the address (16 bytes, an
// IPv4 one mapped), the port (network order), 2 zero bytes.
const xdpKeyLen = 20

const (
	xdpPass = 2 // XDP_PASS
)

// xdpKey is the ports-map key for a.
func xdpKey(a netip.AddrPort) [xdpKeyLen]byte {
	var k [xdpKeyLen]byte
	ip := a.Addr().As16() // IPv4 comes out mapped: ::ffff:a.b.c.d
	copy(k[:16], ip[:])
	binary.BigEndian.PutUint16(k[16:18], a.Port())
	return k
}

// be16 is the value a 16-bit load from the packet gives for the
// network-order value v.
func be16(v uint16) int32 {
	return int32(binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, v)))
}

// xdpObjs are a link's program and maps.
type xdpObjs struct {
	prog  *ebpf.Program
	ports *ebpf.Map // xdpKey -> 1
	xsks  *ebpf.Map // queue index -> AF_XDP socket
}

func (o *xdpObjs) close() {
	if o.prog != nil {
		o.prog.Close()
	}
	if o.ports != nil {
		o.ports.Close()
	}
	if o.xsks != nil {
		o.xsks.Close()
	}
}

// loadXDPProgram creates the maps (the socket map with room for queues
// 0..queues-1) and loads the program.
func loadXDPProgram(queues int) (*xdpObjs, error) {
	o := &xdpObjs{}
	var err error
	o.ports, err = ebpf.NewMap(&ebpf.MapSpec{
		Name: "udiwarp_ports", Type: ebpf.Hash, KeySize: xdpKeyLen, ValueSize: 4, MaxEntries: 16,
	})
	if err != nil {
		return nil, fmt.Errorf("ports map: %w", err)
	}
	o.xsks, err = ebpf.NewMap(&ebpf.MapSpec{
		Name: "udiwarp_xsks", Type: ebpf.XSKMap, KeySize: 4, ValueSize: 4, MaxEntries: uint32(max(queues, 1)),
	})
	if err != nil {
		o.close()
		return nil, fmt.Errorf("xsk map: %w", err)
	}
	o.prog, err = ebpf.NewProgramWithOptions(&ebpf.ProgramSpec{
		Name:         xdpProgName,
		Type:         ebpf.XDP,
		License:      "Dual MIT/GPL",
		Instructions: xdpInstructions(o.ports.FD(), o.xsks.FD()),
	}, ebpf.ProgramOptions{LogSizeStart: 1 << 16})
	if err != nil {
		o.close()
		return nil, fmt.Errorf("load XDP program: %w", err)
	}
	return o, nil
}

// xdpInstructions is the program. Registers: R6 the context, R2 the
// frame's start plus the VLAN tag's and IPv4 options' lengths (so that
// R2+14 is the IP header, then R2+14 is the UDP header), R3 its end. The
// key is built on the stack at R10-24.
func xdpInstructions(portsFD, xsksFD int) asm.Instructions {
	const (
		l3     = ethHdrLen
		keyOff = -24
	)
	var mapped [4]byte = [4]byte{0, 0, 0xff, 0xff}
	return asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, 0, asm.Word), // xdp_md.data
		asm.LoadMem(asm.R3, asm.R6, 4, asm.Word), // xdp_md.data_end
		// Ethernet.
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, ethHdrLen),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 12, asm.Half),
		asm.JNE.Imm(asm.R5, be16(etherTypeVLAN), "l3"),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, ethHdrLen+vlanTagLen),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 16, asm.Half),
		asm.Add.Imm(asm.R2, vlanTagLen),
		asm.JEq.Imm(asm.R5, be16(etherTypeIPv4), "ipv4").WithSymbol("l3"),
		asm.JEq.Imm(asm.R5, be16(etherTypeIPv6), "ipv6"),
		asm.Ja.Label("pass"),

		// IPv4: version 4, IHL >= 5, UDP, not a fragment.
		asm.Mov.Reg(asm.R4, asm.R2).WithSymbol("ipv4"),
		asm.Add.Imm(asm.R4, l3+ipv4HdrLen),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, l3, asm.Byte),
		asm.Mov.Reg(asm.R7, asm.R5),
		asm.RSh.Imm(asm.R7, 4),
		asm.JNE.Imm(asm.R7, 4, "pass"),
		asm.And.Imm(asm.R5, 0x0f),
		asm.JLT.Imm(asm.R5, 5, "pass"),
		asm.LoadMem(asm.R7, asm.R2, l3+9, asm.Byte),
		asm.JNE.Imm(asm.R7, protoUDP, "pass"),
		asm.LoadMem(asm.R7, asm.R2, l3+6, asm.Half),
		asm.And.Imm(asm.R7, be16(0x3fff)),
		asm.JNE.Imm(asm.R7, 0, "pass"),
		// Key: ::ffff:daddr.
		asm.StoreImm(asm.R10, keyOff, 0, asm.Word),
		asm.StoreImm(asm.R10, keyOff+4, 0, asm.Word),
		asm.StoreImm(asm.R10, keyOff+8, int64(binary.NativeEndian.Uint32(mapped[:])), asm.Word),
		asm.LoadMem(asm.R7, asm.R2, l3+16, asm.Word),
		asm.StoreMem(asm.R10, keyOff+12, asm.R7, asm.Word),
		// Past the IP header: R2 += IHL*4 (20..60).
		asm.LSh.Imm(asm.R5, 2),
		asm.Add.Reg(asm.R2, asm.R5),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, l3+udpHdrLen),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.Ja.Label("udp"),

		// IPv6: version 6, next header UDP.
		asm.Mov.Reg(asm.R4, asm.R2).WithSymbol("ipv6"),
		asm.Add.Imm(asm.R4, l3+ipv6HdrLen+udpHdrLen),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, l3, asm.Byte),
		asm.RSh.Imm(asm.R5, 4),
		asm.JNE.Imm(asm.R5, 6, "pass"),
		asm.LoadMem(asm.R5, asm.R2, l3+6, asm.Byte),
		asm.JNE.Imm(asm.R5, protoUDP, "pass"),
		asm.LoadMem(asm.R7, asm.R2, l3+24, asm.DWord),
		asm.StoreMem(asm.R10, keyOff, asm.R7, asm.DWord),
		asm.LoadMem(asm.R7, asm.R2, l3+32, asm.DWord),
		asm.StoreMem(asm.R10, keyOff+8, asm.R7, asm.DWord),
		asm.Add.Imm(asm.R2, ipv6HdrLen),

		// UDP at R2+14, its 8 bytes checked: the destination port.
		asm.LoadMem(asm.R7, asm.R2, l3+2, asm.Half).WithSymbol("udp"),
		asm.StoreMem(asm.R10, keyOff+16, asm.R7, asm.Half),
		asm.StoreImm(asm.R10, keyOff+18, 0, asm.Half),
		asm.LoadMapPtr(asm.R1, portsFD),
		asm.Mov.Reg(asm.R2, asm.R10),
		asm.Add.Imm(asm.R2, keyOff),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.LoadMapPtr(asm.R1, xsksFD),
		asm.LoadMem(asm.R2, asm.R6, 16, asm.Word), // xdp_md.rx_queue_index
		asm.Mov.Imm(asm.R3, xdpPass),
		asm.FnRedirectMap.Call(),
		asm.Return(),

		asm.Mov.Imm(asm.R0, xdpPass).WithSymbol("pass"),
		asm.Return(),
	}
}
