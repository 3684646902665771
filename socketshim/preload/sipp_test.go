package preload_test

import (
	"context"
	"encoding/csv"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// needSIPp skips the test unless SIPp is installed.
func needSIPp(t *testing.T) {
	t.Helper()
	if lookPath("sipp") == "" {
		t.Skip("sipp is not installed (Debian: apt-get install sip-tester; .ci/run installs it)")
	}
}

// sippRun says how sippCalls runs SIPp.
type sippRun struct {
	transport string // SIPp's -t: un (a UDP socket per call) or tn (TCP, a connection per call)
	calls     int
	// reliable: the datagrams under SIPp are delivered reliably (RD), so
	// SIPp's own retransmissions are off (-nr), as a SIP element's are
	// over a reliable transport (RFC 3261 §17.1.1.2: timers A and E run
	// only over an unreliable one). Left on, a UAC held off the CPU for
	// SIPp's T1 (500 ms) sends an INVITE again after the UAS has sent its
	// 180 and 200, and SIPp's UAS (3.6, Debian's sip-tester) does not
	// take that INVITE for a retransmission (only the first send after a
	// receive remembers it) and aborts the call: "Aborting call on
	// unexpected message ... while expecting 'ACK'". The UAC's BYE then
	// goes unanswered through its retransmission budget.
	reliable bool
}

// sippCalls runs SIPp's built-in SipStone basic call scenarios between a
// preloaded UAS and a preloaded UAC, calls r.calls on SIPp transport
// r.transport, and checks every call completed, none failed, and both
// engines carried every SIP message: per call the UAC sends INVITE, ACK
// and BYE and receives 180 Ringing and two 200 OKs, each on its own
// socket. It returns the two engines' stats.
func sippCalls(t *testing.T, r sippRun) (uac, uas stats) {
	t.Helper()
	transport, calls := r.transport, r.calls
	dir := built(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	port := strconv.Itoa(freePort(t))
	maxSock := strconv.Itoa(calls + 64)
	var env []string
	if transport == "tn" {
		env = rcEnv // SIPp's TCP over RC
	}
	srv := startEnv(t, ctx, dir, true, env, "sipp", append(sippArgs(r), "-sn", "uas", "-t", transport, "-i", "127.0.0.1", "-p", port, "-nostdin", "-max_socket", maxSock)...)
	if transport == "tn" {
		waitTCP(t, atoi(t, port), srv)
	} else {
		waitUDP(t, atoi(t, port), srv)
	}
	stf := filepath.Join(t.TempDir(), "uac.csv")
	n := strconv.Itoa(calls)
	cli := startEnv(t, ctx, dir, true, env, "sipp", append(sippArgs(r), "-sn", "uac", "-t", transport, "-i", "127.0.0.1", "127.0.0.1:"+port,
		"-r", n, "-l", n, "-m", n, "-d", "500", "-nostdin", "-max_socket", maxSock,
		"-trace_stat", "-stf", stf, "-fd", "1", "-timeout", "60s", "-timeout_error")...)
	out := cli.wait(t) // SIPp exits 1 when any call failed, and wait fails the test
	st := sippStat(t, stf)
	t.Logf("SIPp UAC statistics: created %s, successful %s, failed %s, retransmissions %s",
		st["TotalCallCreated"], st["SuccessfulCall(C)"], st["FailedCall(C)"], st["Retransmissions(C)"])
	if st["SuccessfulCall(C)"] != n || st["FailedCall(C)"] != "0" {
		t.Fatalf("SIPp completed %s of %d calls, %s failed\n%s", st["SuccessfulCall(C)"], calls, st["FailedCall(C)"], out)
	}
	if r.reliable && st["Retransmissions(C)"] != "0" {
		t.Errorf("SIPp sent %s retransmissions over a reliable transport (-nr)", st["Retransmissions(C)"])
	}
	uac = cli.readStats(t) // it exited: its last write is done
	msgs := uint64(3 * calls)
	uas = srv.statsWhen(t, func(uas stats) bool {
		if transport == "tn" {
			return uas.Streams >= uint64(calls) && uas.StreamReceived == uac.StreamSent && uas.StreamSent == uac.StreamReceived
		}
		return uas.Received >= msgs && uas.Sent >= msgs && uas.DeviceRx >= uas.Received
	})
	srv.stop(syscall.SIGINT)
	t.Logf("UAC engine %+v; UAS engine %+v", uac, uas)
	if transport == "tn" {
		// A TCP connection per call, each an RC QP at both ends, and every
		// SIP message in them.
		if uac.Streams < uint64(calls) || uas.Streams < uint64(calls) {
			t.Errorf("the engines ran %d (UAC) and %d (UAS) streams for %d calls: not a connection per call over RC", uac.Streams, uas.Streams, calls)
		}
		if uac.StreamsPlain+uas.StreamsPlain+uac.StreamsRefused+uas.StreamsRefused != 0 {
			t.Errorf("plain or refused streams: UAC %+v UAS %+v", uac, uas)
		}
		if uac.StreamSent == 0 || uac.StreamSent != uas.StreamReceived || uas.StreamSent != uac.StreamReceived {
			t.Errorf("the engines' bytes do not match: UAC sent %d, UAS received %d; UAS sent %d, UAC received %d",
				uac.StreamSent, uas.StreamReceived, uas.StreamSent, uac.StreamReceived)
		}
		return uac, uas
	}
	if uac.Sockets < uint64(calls) {
		t.Errorf("the UAC's engine ran %d sockets for %d calls: not a socket per call", uac.Sockets, calls)
	}
	if uac.Sent < msgs || uac.Received < msgs || uas.Received < msgs || uas.Sent < msgs {
		t.Errorf("the engines carried fewer than the %d SIP messages each way: UAC sent %d received %d, UAS received %d sent %d",
			msgs, uac.Sent, uac.Received, uas.Received, uas.Sent)
	}
	if uac.DeviceTx < uac.Sent || uas.DeviceRx < uas.Received {
		t.Errorf("the devices framed fewer datagrams than the engines counted: UAC %+v UAS %+v", uac, uas)
	}
	return uac, uas
}

// SIPp, unmodified, over the preload on UD: seed 003's SipStone basic
// call test, a UDP socket per call (-t un), 50 calls (experiments/
// sipp.go measures its memory and response times at 1,000 and more).
func TestSIPpUD(t *testing.T) {
	needSIPp(t)
	sippCalls(t, sippRun{transport: "un", calls: 50})
}

// SIPp over RC: the same calls, a TCP connection per call (-t tn), each
// an RC QP in both SIPp processes (UDIWARP_PRELOAD_TCP=rc).
func TestSIPpRC(t *testing.T) {
	needSIPp(t)
	sippCalls(t, sippRun{transport: "tn", calls: 50})
}

// sippArgs is what r adds to both SIPp command lines.
func sippArgs(r sippRun) []string {
	if r.reliable {
		return []string{"-nr"}
	}
	return nil
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	v, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// sippStat reads the last line of a SIPp statistics file (-trace_stat
// -stf, ';'-separated, a header line first) by column name.
func sippStat(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("SIPp wrote no statistics: %v", err)
	}
	defer f.Close()
	rd := csv.NewReader(f)
	rd.Comma, rd.FieldsPerRecord, rd.LazyQuotes = ';', -1, true
	recs, err := rd.ReadAll()
	if err != nil || len(recs) < 2 {
		t.Fatalf("SIPp statistics %s: %v (%d lines)", path, err, len(recs))
	}
	m := map[string]string{}
	last := recs[len(recs)-1]
	for i, h := range recs[0] {
		if i < len(last) && h != "" {
			m[h] = last[i]
		}
	}
	return m
}
