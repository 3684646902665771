package rds_test

import (
	"fmt"
	"time"

	"github.com/udiwarp/udiwarp/socketshim/rds"
)

// The man page's exchange on loopback: the client maps a buffer and asks
// the server for data; the server writes it into the client's memory
// with the RDMA ACK; the client reads the ACK, and the data is there; the
// server is notified.
func Example() {
	client, _ := rds.Listen("udp4", "127.0.0.1:0", nil)
	defer client.Close()
	server, _ := rds.Listen("udp4", "127.0.0.1:0", nil)
	defer server.Close()
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	server.SetReadDeadline(time.Now().Add(5 * time.Second))
	msg := make([]byte, 100)

	// Client: the RDMA request, with a cookie for buf.
	buf := make([]byte, 64)
	if _, err := client.SendMsg([]byte("send me the greeting"), server.LocalAddr(),
		rds.MapControl{Buf: buf, Flags: rds.UseOnce}); err != nil {
		fmt.Println(err)
		return
	}

	// Server: the request brings the cookie.
	n, from, ctrl, _ := server.RecvMsg(msg)
	fmt.Printf("server got %q\n", msg[:n])
	cookie := ctrl[0].(rds.DestControl).Cookie

	// Server: the RDMA Write and its ACK, atomically.
	data := []byte("hello, zerocopy")
	if _, err := server.SendMsg([]byte("done"), from, rds.ArgsControl{
		Cookie: cookie,
		Remote: rds.Range{Offset: 0, Len: uint64(len(data))},
		Local:  [][]byte{data},
		Flags:  rds.ReadWrite | rds.NotifyMe,
		Token:  42,
	}); err != nil {
		fmt.Println(err)
		return
	}

	// Client: the ACK means the data is in place.
	n, _, _, _ = client.RecvMsg(msg)
	fmt.Printf("client got %q, buffer holds %q\n", msg[:n], buf[:len(data)])

	// Server: the notification.
	_, _, ctrl, _ = server.RecvMsg(msg)
	st := ctrl[0].(rds.StatusControl)
	fmt.Printf("server notified: token %d, %v\n", st.Token, st.Status)
	// Output:
	// server got "send me the greeting"
	// client got "done", buffer holds "hello, zerocopy"
	// server notified: token 42, success
}
