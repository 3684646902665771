package udiwarp

import "encoding/binary"

// ReadRequestSize is the RDMAP header of an RDMA Read Request (RFC 5040
// §4.4), after the untagged DDP header.
const ReadRequestSize = 28

// ReadRequest is a view of the Read Request header:
//
//	0          4                12         16         20               28
//	+----------+----------------+----------+----------+----------------+
//	| Sink STag| Sink TO        | Size     | Src STag | Src TO         |
//	+----------+----------------+----------+----------+----------------+
type ReadRequest []byte

// ReadRequestFields holds every field of a Read Request header.
type ReadRequestFields struct {
	SinkSTag   uint32
	SinkTO     uint64
	Size       uint32
	SourceSTag uint32
	SourceTO   uint64
}

func (r ReadRequest) SinkSTag() uint32   { return binary.BigEndian.Uint32(r[0:]) }
func (r ReadRequest) SinkTO() uint64     { return binary.BigEndian.Uint64(r[4:]) }
func (r ReadRequest) Size() uint32       { return binary.BigEndian.Uint32(r[12:]) }
func (r ReadRequest) SourceSTag() uint32 { return binary.BigEndian.Uint32(r[16:]) }
func (r ReadRequest) SourceTO() uint64   { return binary.BigEndian.Uint64(r[20:]) }

// Encode writes every field; r must be at least ReadRequestSize long.
func (r ReadRequest) Encode(f *ReadRequestFields) {
	_ = r[ReadRequestSize-1]
	binary.BigEndian.PutUint32(r[0:], f.SinkSTag)
	binary.BigEndian.PutUint64(r[4:], f.SinkTO)
	binary.BigEndian.PutUint32(r[12:], f.Size)
	binary.BigEndian.PutUint32(r[16:], f.SourceSTag)
	binary.BigEndian.PutUint64(r[20:], f.SourceTO)
}
