package parked

import "testing"

//go:noinline
func blockedOn(c chan struct{}) { <-c }

func TestWait(t *testing.T) {
	c := make(chan struct{})
	go blockedOn(c)
	Wait(t, "parked.blockedOn")
	close(c)
}
