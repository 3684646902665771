package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "udstream: not built yet; it needs the verbs library (issue 3) and Write-Record (issue 4)")
	os.Exit(2)
}
