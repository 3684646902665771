//go:build !amd64 || purego

package crc32c

const (
	foldMin    = 0 // no folding kernel
	kernelName = ""
)

var useArch = false

func archUpdate(crc uint32, p []byte) uint32 { panic("crc32c: no kernel on this architecture") }
