package socketshim

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "udiwarp"}, DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestQUICEcho runs quic-go, unchanged, over two PacketConns: a QUIC
// server that echoes a stream, and a client.
func TestQUICEcho(t *testing.T) {
	srvConn, cliConn := pair(t)
	cert := selfSigned(t)
	ln, err := quic.Listen(srvConn, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"echo"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		conn, err := ln.Accept(ctx)
		if err != nil {
			done <- err
			return
		}
		s, err := conn.AcceptStream(ctx)
		if err != nil {
			done <- err
			return
		}
		_, err = io.Copy(s, s)
		s.Close()
		done <- err
	}()
	tr := &quic.Transport{Conn: cliConn}
	defer tr.Close()
	conn, err := tr.Dial(ctx, srvConn.LocalAddr(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"echo"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := conn.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, 300000)
	rand.Read(msg)
	go func() { s.Write(msg); s.Close() }()
	got, err := io.ReadAll(s)
	if err != nil || len(got) != len(msg) || string(got) != string(msg) {
		t.Fatalf("echo: %d of %d bytes, %v", len(got), len(msg), err)
	}
	conn.CloseWithError(0, "done")
	// The server's copy ends at the client's stream end (nil, EOF) or at
	// its "done" (its application error 0, remote); anything else fails.
	if err := <-done; err != nil && err != io.EOF {
		var ae *quic.ApplicationError
		if !errors.As(err, &ae) || ae.ErrorCode != 0 || !ae.Remote {
			t.Fatalf("server: %v", err)
		}
	}
	if srvConn.Device().Stats().RxDatagrams.Load() == 0 {
		t.Fatal("QUIC did not go through the stack")
	}
	t.Logf("%d datagrams through the stack", srvConn.Device().Stats().RxDatagrams.Load()+cliConn.Device().Stats().RxDatagrams.Load())
}

// TestHTTP3 serves an HTTP/3 request with quic-go's http3 package over a
// PacketConn, and fetches it with its client over another.
func TestHTTP3(t *testing.T) {
	srvConn, cliConn := pair(t)
	cert := selfSigned(t)
	srv := &http3.Server{
		TLSConfig: http3.ConfigureTLSConfig(&tls.Config{Certificates: []tls.Certificate{cert}}),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "hello %s over %s", r.URL.Path, r.Proto)
		}),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(srvConn) }()
	defer func() { srv.Close(); <-served }()
	tr := &quic.Transport{Conn: cliConn}
	defer tr.Close()
	rt := &http3.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
		Dial: func(ctx context.Context, _ string, tlsConf *tls.Config, conf *quic.Config) (*quic.Conn, error) {
			return tr.DialEarly(ctx, srvConn.LocalAddr(), tlsConf, conf)
		},
	}
	defer rt.Close()
	client := &http.Client{Transport: rt, Timeout: 10 * time.Second}
	resp, err := client.Get("https://localhost/udiwarp")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(body) != "hello /udiwarp over HTTP/3.0" {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
}
