//go:build !race

package main

// raceEnabled: the test binary runs under the race detector.
const raceEnabled = false
