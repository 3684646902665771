//go:build !amd64 || purego

package crc32c

const (
	foldMin    = 1 << 62
	kernelName = ""
)

const useFold = false

func fold(crc uint32, p []byte) uint32 { panic("crc32c: no folding kernel on this architecture") }
