package qp_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/udiwarp/udiwarp/qp"
)

// A socket the caller opened carries a UD QP's traffic, at the address
// the caller bound; Close closes it.
func TestBindConn(t *testing.T) {
	uc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	want := uc.LocalAddr().(*net.UDPAddr).AddrPort()
	open := func(bind func(*qp.Device) (*qp.Socket, error)) (*qp.Device, *qp.Socket, *qp.PD, *qp.CQ, *qp.QP, *qp.MR) {
		t.Helper()
		dev, err := qp.Open(qp.DeviceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dev.Close() })
		sock, err := bind(dev)
		if err != nil {
			t.Fatal(err)
		}
		pd := dev.AllocPD()
		cq, _ := dev.CreateCQ(16)
		q, err := pd.CreateQP(qp.QPAttr{Type: qp.UD, SendCQ: cq, RecvCQ: cq})
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range []qp.ModifyAttr{{State: qp.StateInit, Socket: sock}, {State: qp.StateRTR}, {State: qp.StateRTS}} {
			if err := q.Modify(st); err != nil {
				t.Fatal(err)
			}
		}
		mr, err := pd.RegisterMemory(make([]byte, 4096), qp.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		return dev, sock, pd, cq, q, mr
	}
	devB, sockB, _, cqB, qpB, mrB := open(func(d *qp.Device) (*qp.Socket, error) { return d.BindConn(uc) })
	if sockB.LocalAddr() != want {
		t.Fatalf("local address %v, want %v", sockB.LocalAddr(), want)
	}
	_, _, pdA, _, qpA, mrA := open(func(d *qp.Device) (*qp.Socket, error) { return d.Bind("udp4", "127.0.0.1:0") })
	if err := qpB.PostRecv(&qp.RecvWR{ID: 1, SGL: []qp.SGE{mrB.SGE(0, 4096)}}); err != nil {
		t.Fatal(err)
	}
	copy(mrA.Bytes(), "adopted")
	ah, err := pdA.CreateAH(want, qpB.QPN())
	if err != nil {
		t.Fatal(err)
	}
	if err := qpA.PostSend(&qp.SendWR{ID: 2, SGL: []qp.SGE{mrA.SGE(0, 7)}, AH: ah}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wc := make([]qp.WorkCompletion, 1)
	for cqB.Poll(wc) == 0 {
		if err := cqB.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if wc[0].Status != qp.Success || string(mrB.Bytes()[:wc[0].Len]) != "adopted" {
		t.Fatalf("received %v %q", wc[0].Status, mrB.Bytes()[:wc[0].Len])
	}
	devB.Close()
	if _, err := uc.WriteToUDPAddrPort([]byte("x"), want); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("after the device closed, the socket writes: %v", err)
	}
	if _, err := devB.BindConn(uc); !errors.Is(err, qp.ErrClosed) {
		t.Fatalf("BindConn on a closed device: %v", err)
	}
	dev, err := qp.Open(qp.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	if _, err := dev.BindConn(nil); !errors.Is(err, qp.ErrInvalidAttr) {
		t.Fatalf("BindConn(nil): %v", err)
	}
}
