package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// udstreamFigure is seed 003's streaming experiment with udstream: the
// receiver's initial buffering (its request until it holds 500 ms of
// stream by the stream's clock) of one ffmpeg-made MPEG-TS stream over
// each transport, under each loss rate, the sender in the server
// namespace and the receiver in the client one (or both in this one, in
// process loss). Full runs pace the stream at its own rate, as a live
// source is; quick ones send as fast as the transport takes it.
func udstreamFigure(e *env, f *figure, o options) ([]row, error) {
	if e.host != "" {
		fmt.Fprintln(e.log, "experiments: fig19: runs on one machine (two namespaces), not against -server: skipped")
		return nil, nil
	}
	if _, err := exec.LookPath("ffmpeg"); err != nil {
		fmt.Fprintln(e.log, "experiments: fig19: no ffmpeg (Debian package ffmpeg; .ci/run installs it): skipped")
		return nil, nil
	}
	bin, err := e.tool("udstream")
	if err != nil {
		return nil, err
	}
	secs, speed, transports, losses := "4", "1", []string{"wr-ud", "wr-rd", "send-ud", "rc", "udp"}, []float64{0, 0.5, 1, 5}
	if e.quick {
		secs, speed, transports, losses = "2", "0", []string{"wr-ud", "rc", "udp"}, []float64{0, 5}
	}
	f.X = losses
	in := filepath.Join(e.work, "in.ts")
	if _, err := os.Stat(in); err != nil {
		gen := exec.Command("ffmpeg", "-v", "error", "-f", "lavfi", "-i", "testsrc=size=640x360:rate=25", "-f", "lavfi",
			"-i", "sine=frequency=440:sample_rate=48000", "-t", secs, "-c:v", "mpeg2video", "-b:v", "1M", "-c:a", "mp2", "-f", "mpegts", in)
		if out, err := gen.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("ffmpeg: %v: %s", err, out)
		}
	}
	f.Series = nil
	for _, t := range transports {
		f.Series = append(f.Series, series{Label: t, Mode: t})
	}
	port := 5200
	var rows []row
	for _, pct := range losses {
		if err := e.setLoss(pct); err != nil {
			return rows, err
		}
		for r := range o.rounds {
			for k := range transports {
				t := transports[(k+r)%len(transports)]
				if e.method == "inproc" && t == "rc" && pct > 0 {
					continue // TCP cannot drop on request
				}
				port++
				got, err := e.stream(bin, in, t, port, speed, pct, r)
				if err != nil && pct > 0 {
					// Under loss a transfer may not finish: a point of the
					// figure that failed, which the report counts.
					fmt.Fprintf(e.log, "experiments: %s: %s at %v %%, round %d failed: %v\n", f.ID, t, pct, r+1, err)
					got, err = row{"failed": err.Error(), "initial_buffering_ms": 0.0}, nil
				}
				if err != nil {
					return rows, fmt.Errorf("%s at %v %%, round %d: %w", t, pct, r+1, err)
				}
				got["figure"], got["series"], got["x"], got["round"], got["loss_pct"] = f.ID, t, pct, r+1, pct
				got["loss_method"] = e.method
				got["value"], got["unit"] = got.num("initial_buffering_ms"), "ms"
				got["speed"] = speed
				rows = append(rows, got)
			}
		}
	}
	return rows, e.setLoss(0)
}

// stream runs one sender and one receiver of transport t and returns the
// receiver's figures.
func (e *env) stream(bin, in, t string, port int, speed string, pct float64, round int) (row, error) {
	host := "127.0.0.1"
	var sndPrefix, rcvPrefix []string
	if e.method != "inproc" {
		if err := e.ensureTopology(); err != nil {
			return nil, err
		}
		host = srvAddr
		sndPrefix = []string{"ip", "netns", "exec", e.topo.srv}
		rcvPrefix = e.clientPrefix()
	}
	addr := host + ":" + strconv.Itoa(port)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	snd := append(sndPrefix, bin, "send", "-t", t, "-listen", addr, "-i", in, "-speed", speed, "-q", "-wait", "20s")
	// The receiver ends a datagram stream whose end message was lost
	// after a second of silence; TCP is silent longer only while its
	// retransmission timer backs off under loss, and its end is the FIN.
	idle := "1s"
	if t == "rc" {
		idle = "15s"
	}
	rcv := append(rcvPrefix, bin, "recv", "-t", t, "-from", addr, "-o", filepath.Join(e.work, "out.ts"), "-json", "-q", "-wait", "20s", "-idle", idle)
	if e.method == "inproc" && pct > 0 {
		loss := strconv.FormatFloat(pct/100, 'g', -1, 64)
		seed := strconv.Itoa(round + 1)
		snd = append(snd, "-loss", loss, "-seed", seed)
		rcv = append(rcv, "-loss", loss, "-seed", seed)
	}
	sc := exec.CommandContext(ctx, snd[0], snd[1:]...)
	if err := sc.Start(); err != nil {
		return nil, err
	}
	defer sc.Wait()
	var stderr bytes.Buffer
	rc := exec.CommandContext(ctx, rcv[0], rcv[1:]...)
	rc.Stderr = &stderr
	out, err := rc.Output()
	if err != nil {
		sc.Process.Kill()
		return nil, fmt.Errorf("%s: %v: %s", strings.Join(rcv, " "), err, strings.TrimSpace(stderr.String()))
	}
	var r row
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("the receiver's JSON: %v: %.200s", err, out)
	}
	r["command"] = strings.Join(snd, " ") + " & " + strings.Join(rcv, " ")
	return r, nil
}

// shimFigure is seed 003's measure of the socket interface's cost: the
// pre-buffering time of a stream sent as fast as the transport takes it
// (udstream -speed 0) through the socket shim (send-ud:
// socketshim.PacketConn over a UD QP) against plain UDP sockets, for
// streams of several bit rates, no loss, on this host's loopback.
func shimFigure(e *env, f *figure, o options) ([]row, error) {
	if _, err := exec.LookPath("ffmpeg"); err != nil {
		fmt.Fprintln(e.log, "experiments: fig-shim: no ffmpeg (Debian package ffmpeg; .ci/run installs it): skipped")
		return nil, nil
	}
	bin, err := e.tool("udstream")
	if err != nil {
		return nil, err
	}
	rates := []int{1, 4, 16}
	if e.quick {
		rates = []int{1, 16} // two points: a line to draw
	}
	f.X = nil
	f.Series = []series{{Label: "send-ud (socket shim over UD)", Mode: "send-ud"}, {Label: "udp (kernel sockets)", Mode: "udp"}}
	saved := e.method
	e.method = "inproc" // loopback of this namespace, nothing lost
	defer func() { e.method = saved }()
	port := 5600
	var rows []row
	for _, mbps := range rates {
		f.X = append(f.X, float64(mbps))
		in := filepath.Join(e.work, fmt.Sprintf("shim-%d.ts", mbps))
		gen := exec.Command("ffmpeg", "-v", "error", "-f", "lavfi", "-i", "testsrc=size=640x360:rate=25", "-t", "3",
			"-c:v", "mpeg2video", "-b:v", fmt.Sprintf("%dM", mbps), "-maxrate", fmt.Sprintf("%dM", mbps), "-bufsize", fmt.Sprintf("%dM", mbps),
			"-f", "mpegts", in)
		if out, err := gen.CombinedOutput(); err != nil {
			return rows, fmt.Errorf("ffmpeg: %v: %s", err, out)
		}
		for r := range o.rounds {
			for k := range f.Series {
				s := f.Series[(k+r)%len(f.Series)]
				port++
				got, err := e.stream(bin, in, s.Mode, port, "0", 0, r)
				if err != nil {
					return rows, fmt.Errorf("%s at %d Mb/s, round %d: %w", s.Mode, mbps, r+1, err)
				}
				got["figure"], got["series"], got["x"], got["round"], got["loss_pct"] = f.ID, s.Label, float64(mbps), r+1, 0.0
				got["loss_method"], got["speed"], got["stream_mbps"] = "none", "0", mbps
				got["value"], got["unit"] = got.num("initial_buffering_ms"), "ms"
				rows = append(rows, got)
			}
		}
	}
	return rows, nil
}
