package qp

import (
	"fmt"
	"strings"
	"testing"

	"github.com/udiwarp/udiwarp/internal/snapshot"
)

// TestStatsSnapshot: StatsSnapshot has Stats's counters field for field
// (go generate keeps it so; this fails when it was not run), and a
// snapshot holds their values as integers that print as numbers, where a
// Stats field printed shows the atomic's insides ({{} {} 1}).
func TestStatsSnapshot(t *testing.T) {
	if err := snapshot.Match(StatsSnapshot{}, Stats{}); err != nil {
		t.Fatal(err)
	}
	var s Stats
	s.RxNoRecv.Store(3)
	s.RCFPDUsSent.Store(7)
	s.Completions[Success].Store(5)
	s.Completions[15].Store(9)
	snap := s.Snapshot()
	if snap.RxNoRecv != 3 || snap.RCFPDUsSent != 7 || snap.Completions[Success] != 5 || snap.Completions[15] != 9 {
		t.Fatalf("%+v", snap)
	}
	if got := fmt.Sprint(snap.RxNoRecv); got != "3" {
		t.Fatalf("printed %q", got)
	}
	if p := fmt.Sprintf("%+v", snap); !strings.Contains(p, "RxNoRecv:3 ") || strings.Contains(p, "{}") {
		t.Fatalf("%%+v of a snapshot: %s", p)
	}
}
