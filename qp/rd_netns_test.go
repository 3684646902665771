package qp

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/internal/netnstest"
	"github.com/udiwarp/udiwarp/reliability"
)

// TestRDNetnsRandomLoss runs RD between two network namespaces joined by
// a veth pair, with nftables dropping a share of the UDP datagrams that
// enter each namespace at random (numgen random): the kernel's loss, not
// the impairment layer's. Every message arrives once, in order,
// byte-exact; every WR completes successfully.
func TestRDNetnsRandomLoss(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nftables' nft (Debian package nftables; .ci/run installs it)")
	}
	for _, pct := range []int{1, 5} {
		t.Run(fmt.Sprintf("loss %d%%", pct), func(t *testing.T) {
			nsA := newNetns(t, "link set lo up")
			nsB := newNetns(t, "link set lo up")
			veth := fmt.Sprintf("udr%d", netnstest.Seq())
			rules := filepath.Join(t.TempDir(), "loss.nft")
			script := fmt.Sprintf("table inet udiwarp_loss {\n chain in {\n  type filter hook input priority 0; policy accept;\n  meta l4proto udp numgen random mod 100 < %d drop\n }\n}\n", pct)
			if err := os.WriteFile(rules, []byte(script), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, c := range [][]string{
				{nsA, "!ip link add " + veth + "a netns " + nsA + " type veth peer name " + veth + "b netns " + nsB},
				{nsA, "addr add 10.212.0.1/24 dev " + veth + "a"}, {nsA, "link set " + veth + "a up"},
				{nsB, "addr add 10.212.0.2/24 dev " + veth + "b"}, {nsB, "link set " + veth + "b up"},
				{nsA, "!ip netns exec " + nsA + " nft -f " + rules},
				{nsB, "!ip netns exec " + nsB + " nft -f " + rules},
			} {
				runIn(t, c[0], c[1])
			}
			rd := RDConfig{Config: reliability.Config{InitialRTT: time.Millisecond}}
			var a, b *node
			var qa, qb *QP
			var cqa, cqb *CQ
			inNetns(t, nsA, func() { a = newNode(t, DeviceConfig{}, "udp4", "10.212.0.1:0"); qa, cqa = rdQPOn(t, a, rd) })
			inNetns(t, nsB, func() { b = newNode(t, DeviceConfig{}, "udp4", "10.212.0.2:0"); qb, cqb = rdQPOn(t, b, rd) })
			region, err := b.pd.RegisterMemory(make([]byte, 512<<10), AccessLocalWrite|AccessRemoteWrite)
			if err != nil {
				t.Fatal(err)
			}
			ah := a.ah(b, qb)
			const n = 500
			const slot = 1400
			for i := range n {
				mustPost(t, qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*slot, slot)}}))
			}
			fill(a.buf[:n*slot], pct)
			for i := range n {
				if err := qa.PostSend(&SendWR{ID: uint64(i), Flags: FlagSignaled, SGL: []SGE{a.mr.SGE(i*slot, slot)}, AH: ah}); err != nil {
					t.Fatal(err)
				}
			}
			if err := qa.PostSend(&SendWR{ID: 9999, Opcode: OpWrite, Flags: FlagSignaled, SGL: []SGE{a.mr.SGE(0, 512<<10)}, AH: ah,
				RemoteSTag: region.STag(), RemoteTO: region.Addr()}); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			for i, wc := range collect(t, cqb, n, 30*time.Second) {
				if wc.ID != uint64(i) || wc.Status != Success || !bytes.Equal(b.buf[i*slot:(i+1)*slot], a.buf[i*slot:(i+1)*slot]) {
					t.Fatalf("receive %d: %+v", i, wc)
				}
			}
			for _, wc := range collect(t, cqa, n+1, 30*time.Second) {
				if wc.Status != Success {
					t.Fatalf("%+v", wc)
				}
			}
			syncRD(qb)
			if !bytes.Equal(region.Bytes(), a.buf[:512<<10]) {
				t.Fatal("the written region differs")
			}
			sa, sb := a.dev.Stats(), b.dev.Stats()
			t.Logf("%d Sends and a 512 KiB Write in %v: a sent %d data frames, %d retransmitted; b sent %d acks",
				n, time.Since(start).Round(time.Millisecond), sa.RDDataSent.Load(), sa.RDRetransmits.Load(), sb.RDAcksSent.Load())
			if sa.RDRetransmits.Load() == 0 {
				t.Fatal("no retransmission: nftables dropped nothing, the test did not test")
			}
		})
	}
}
