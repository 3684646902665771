package main

import (
	"fmt"
	"io"
	"os"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run is udstream's entry point: until issue 17 builds it, one honest line
// whatever the arguments, and exit 2.
func run(_ []string, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "udstream: not built yet; issue 17 (streaming media over Write-Record with ffmpeg and VLC) will build it")
	return 2
}
