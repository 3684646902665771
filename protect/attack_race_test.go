package protect

import (
	"bytes"
	"net/netip"
	"sync"
	"testing"

	"github.com/udiwarp/udiwarp/llp"
)

func TestAttackRace(t *testing.T) {
	psk := bytes.Repeat([]byte{7}, 16)
	net := llp.NewMemNet()
	a := newLink(t, net, addrA, Config{Mode: AEAD, PSK: psk, KeyUpdateAfter: 3})
	b := newLink(t, net, addrB, Config{Mode: AEAD, PSK: psk, KeyUpdateAfter: 3})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				dst := b.LocalAddr()
				if i%7 == 0 {
					dst = netip.AddrPortFrom(dst.Addr(), uint16(100+w))
				}
				a.Write([]llp.Msg{{Bufs: [][]byte{udSend([]byte("xxxxxxxxxxxxxxxx"))}, Addr: dst}})
				if i%50 == 0 {
					a.SetPeerKey(b.LocalAddr(), bytes.Repeat([]byte{byte(i)}, 16))
					a.SetPeerKey(b.LocalAddr(), nil)
				}
			}
		}()
	}
	var rg sync.WaitGroup
	rg.Add(1)
	go func() {
		defer rg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			readAll(b)
			b.Sessions()
		}
	}()
	wg.Wait()
	close(stop)
	rg.Wait()
	t.Logf("%v", snap(b))
}
