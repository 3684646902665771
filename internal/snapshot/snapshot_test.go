package snapshot

import (
	"strings"
	"sync/atomic"
	"testing"
)

type counters struct {
	A      atomic.Uint64
	hidden atomic.Uint32
	B      [2]atomic.Uint64
}

type plain struct {
	A uint64
	B [2]uint64
}

func TestFillAndMatch(t *testing.T) {
	var c counters
	c.A.Store(1)
	c.B[1].Store(2)
	c.hidden.Store(9)
	var p plain
	Fill(&p, &c)
	if p != (plain{A: 1, B: [2]uint64{0, 2}}) {
		t.Fatalf("%+v", p)
	}
	if err := Match(plain{}, counters{}); err != nil {
		t.Fatal(err)
	}
	type missing struct{ A uint64 }
	type renamed struct {
		A uint64
		C [2]uint64
	}
	type short struct {
		A uint64
		B [3]uint64
	}
	for _, bad := range []any{missing{}, renamed{}, short{}} {
		if err := Match(bad, counters{}); err == nil || !strings.Contains(err.Error(), "go generate") {
			t.Errorf("%T: %v", bad, err)
		}
	}
}
