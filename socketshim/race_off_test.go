//go:build !race

package socketshim

const raceEnabled = false
