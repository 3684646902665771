module github.com/udiwarp/udiwarp

go 1.26

require (
	github.com/klauspost/crc32 v1.3.0 // indirect
	golang.org/x/sys v0.34.0 // indirect
)
