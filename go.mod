module github.com/udiwarp/udiwarp

go 1.26.0

require (
	github.com/klauspost/crc32 v1.3.0 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
