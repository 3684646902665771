module github.com/udiwarp/udiwarp

go 1.26.0

require (
	github.com/google/btree v1.1.3
	github.com/klauspost/crc32 v1.3.0
	go.uber.org/goleak v1.3.0
	golang.org/x/net v0.62.0
	golang.org/x/sys v0.49.0
)
