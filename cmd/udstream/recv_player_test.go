package main

import (
	"testing"
	"time"
)

// TestPlayerEndIsNoStall: a player that runs dry because the stream
// ended (a live feed stopped, and the sender waited -idle to say so) has
// not stalled, and was not rebuffering; one that runs dry and gets more
// before the end has stalled, for as long as it waited. (A clean live
// stream ended with "stalls":1, "rebuffering_ms":1400.)
func TestPlayerEndIsNoStall(t *testing.T) {
	t0 := time.Unix(1000, 0)
	run := func(more bool) *player {
		p := &player{need: 500 * time.Millisecond}
		p.begin(t0)
		p.arrive(t0.Add(100*time.Millisecond), time.Second) // 1 s of stream held: playing
		p.tick(t0.Add(1500 * time.Millisecond))             // played out: dry
		if more {
			p.arrive(t0.Add(1700*time.Millisecond), 2*time.Second)
			p.tick(t0.Add(3500 * time.Millisecond)) // played out again
			p.arrive(t0.Add(3600*time.Millisecond), 2500*time.Millisecond)
		}
		p.end(t0.Add(4 * time.Second))
		return p
	}
	if p := run(false); p.stalls != 0 || p.paused != 0 {
		t.Fatalf("the stream's end: %d stalls, %v rebuffering", p.stalls, p.paused)
	}
	if p := run(true); p.stalls == 0 || p.paused == 0 {
		t.Fatalf("dry, then more: %d stalls, %v rebuffering", p.stalls, p.paused)
	}
}
