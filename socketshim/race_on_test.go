//go:build race

package socketshim

const raceEnabled = true
