package qp_test

import (
	"context"
	"fmt"
	"time"

	"github.com/udiwarp/udiwarp/qp"
)

// Two devices on loopback: B posts a receive, A sends "hello" to B's QP.
func Example() {
	open := func() (*qp.Device, *qp.Socket, *qp.PD, *qp.CQ, *qp.QP, *qp.MR) {
		dev, _ := qp.Open(qp.DeviceConfig{})
		sock, _ := dev.Bind("udp4", "127.0.0.1:0")
		pd := dev.AllocPD()
		cq, _ := dev.CreateCQ(64)
		q, _ := pd.CreateQP(qp.QPAttr{Type: qp.UD, SendCQ: cq, RecvCQ: cq})
		q.Activate(sock)
		mr, _ := pd.RegisterMemory(make([]byte, 4096), qp.AccessLocalWrite)
		return dev, sock, pd, cq, q, mr
	}
	devA, _, pdA, cqA, qpA, mrA := open()
	defer devA.Close()
	devB, sockB, _, cqB, qpB, mrB := open()
	defer devB.Close()

	if err := qpB.PostRecv(&qp.RecvWR{ID: 1, SGL: []qp.SGE{mrB.SGE(0, 4096)}}); err != nil {
		fmt.Println(err)
		return
	}

	copy(mrA.Bytes(), "hello")
	ah, _ := pdA.CreateAH(sockB.LocalAddr(), qpB.QPN())
	if err := qpA.PostSend(&qp.SendWR{ID: 2, Flags: qp.FlagSignaled, SGL: []qp.SGE{mrA.SGE(0, 5)}, AH: ah}); err != nil {
		fmt.Println(err)
		return
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wc := make([]qp.WorkCompletion, 1)
	for cqB.Poll(wc) == 0 {
		cqB.Wait(ctx)
	}
	fmt.Printf("received %q from QP %d: %v\n", mrB.Bytes()[:wc[0].Len], wc[0].SourceQPN, wc[0].Status)
	for cqA.Poll(wc) == 0 {
		cqA.Wait(ctx)
	}
	fmt.Printf("send %d: %v\n", wc[0].ID, wc[0].Status)
	// Output:
	// received "hello" from QP 1: success
	// send 2: success
}
