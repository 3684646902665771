package main

import "github.com/udiwarp/udiwarp/udiwarp"

// cafeFrame is a UD Send (QP 6 to QP 5, MSN 9) whose payload's ASCII
// column looks like hex and holds two spaces: a dump's gutter must be
// recognised by what it renders, not by its looks.
func cafeFrame() []byte {
	b := udiwarp.AppendUntagged(nil, &udiwarp.UntaggedFields{Last: true, DV: 2, RDMAP: 0x43, ULP: 6, QN: 5 << 2, MSN: 9})
	b = append(b, "cafe 00  beef 0x42"...)
	return udiwarp.SealDatagram(b, 0)
}

// cafeDumps are the real output of each tool (xxd, od, hexdump, TShark
// 4.0) for cafeFrame; tshark's capture was made with text2pcap -u
// 40000,18515 (IPv4) and with -6 fe80::1,fe80::2 (IPv6).
var cafeDumps = []struct{ tool, text string }{
	{"xxd", "00000000: 4243 0000 0006 0000 0014 0000 0009 0000  BC..............\n" +
		"00000010: 0000 6361 6665 2030 3020 2062 6565 6620  ..cafe 00  beef \n" +
		"00000020: 3078 3432 f666 82bf                      0x42.f..\n"},
	{"xxd -g1", "00000000: 42 43 00 00 00 06 00 00 00 14 00 00 00 09 00 00  BC..............\n" +
		"00000010: 00 00 63 61 66 65 20 30 30 20 20 62 65 65 66 20  ..cafe 00  beef \n" +
		"00000020: 30 78 34 32 f6 66 82 bf                          0x42.f..\n"},
	{"xxd -p", "424300000006000000140000000900000000636166652030302020626565\n" +
		"662030783432f66682bf\n"},
	{"od -An -tx1", " 42 43 00 00 00 06 00 00 00 14 00 00 00 09 00 00\n" +
		" 00 00 63 61 66 65 20 30 30 20 20 62 65 65 66 20\n" +
		" 30 78 34 32 f6 66 82 bf\n"},
	{"od -tx1", "0000000 42 43 00 00 00 06 00 00 00 14 00 00 00 09 00 00\n" +
		"0000020 00 00 63 61 66 65 20 30 30 20 20 62 65 65 66 20\n" +
		"0000040 30 78 34 32 f6 66 82 bf\n" +
		"0000050\n"},
	{"hexdump -C", "00000000  42 43 00 00 00 06 00 00  00 14 00 00 00 09 00 00  |BC..............|\n" +
		"00000010  00 00 63 61 66 65 20 30  30 20 20 62 65 65 66 20  |..cafe 00  beef |\n" +
		"00000020  30 78 34 32 f6 66 82 bf                           |0x42.f..|\n" +
		"00000028\n"},
	{"tshark -x, IPv4 over Ethernet", "0000  20 52 45 43 56 00 20 53 45 4e 44 00 08 00 45 00    RECV. SEND...E.\n" +
		"0010  00 44 12 34 00 00 ff 11 92 6f 0a 01 01 01 0a 02   .D.4.....o......\n" +
		"0020  02 02 9c 40 48 53 00 30 dd be 42 43 00 00 00 06   ...@HS.0..BC....\n" +
		"0030  00 00 00 14 00 00 00 09 00 00 00 00 63 61 66 65   ............cafe\n" +
		"0040  20 30 30 20 20 62 65 65 66 20 30 78 34 32 f6 66    00  beef 0x42.f\n" +
		"0050  82 bf                                             ..\n" +
		"\n"},
	{"tshark -x, IPv6 over Ethernet", "0000  20 52 45 43 56 00 20 53 45 4e 44 00 86 dd 60 00    RECV. SEND...`.\n" +
		"0010  00 00 00 30 11 20 fe 80 00 00 00 00 00 00 00 00   ...0. ..........\n" +
		"0020  00 00 00 00 00 01 fe 80 00 00 00 00 00 00 00 00   ................\n" +
		"0030  00 00 00 00 00 02 9c 40 48 53 00 30 f7 bf 42 43   .......@HS.0..BC\n" +
		"0040  00 00 00 06 00 00 00 14 00 00 00 09 00 00 00 00   ................\n" +
		"0050  63 61 66 65 20 30 30 20 20 62 65 65 66 20 30 78   cafe 00  beef 0x\n" +
		"0060  34 32 f6 66 82 bf                                 42.f..\n" +
		"\n"},
	{"tshark -T fields -e udp.payload", "424300000006000000140000000900000000636166652030302020626565662030783432f66682bf\n"},
}
