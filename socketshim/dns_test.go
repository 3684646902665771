package socketshim

import (
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestDNS serves DNS with miekg/dns, unchanged, on a PacketConn, and asks
// it with miekg/dns's client over a connected Conn.
func TestDNS(t *testing.T) {
	pc, err := ListenPacket("udp4", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	srv := &dns.Server{PacketConn: pc, NotifyStartedFunc: func() { close(started) },
		Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
			m := new(dns.Msg)
			m.SetReply(r)
			rr, _ := dns.NewRR(r.Question[0].Name + " 60 IN A 192.0.2.7")
			m.Answer = append(m.Answer, rr)
			w.WriteMsg(m)
		})}
	done := make(chan error, 1)
	go func() { done <- srv.ActivateAndServe() }()
	<-started
	defer func() { srv.Shutdown(); <-done; pc.Close() }()

	c, err := Dial("udp4", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := new(dns.Msg)
	m.SetQuestion("udiwarp.example.", dns.TypeA)
	cl := &dns.Client{Net: "udp", Timeout: 5 * time.Second}
	r, _, err := cl.ExchangeWithConn(m, &dns.Conn{Conn: c})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "192.0.2.7" {
		t.Fatalf("answer %v", r.Answer)
	}
	if pc.Device().Stats().RxDelivered.Load() == 0 {
		t.Fatal("the query did not go through the stack")
	}
}
