package socketshim

import (
	"fmt"
	"testing"

	"github.com/udiwarp/udiwarp/internal/snapshot"
)

// TestWRStatsSnapshot: WRStatsSnapshot has WRStats's counters field for
// field, and prints them as numbers.
func TestWRStatsSnapshot(t *testing.T) {
	if err := snapshot.Match(WRStatsSnapshot{}, WRStats{}); err != nil {
		t.Fatal(err)
	}
	var s WRStats
	s.Dropped.Store(2)
	s.Credits.Store(4)
	if got := fmt.Sprintf("%+v", s.Snapshot()); got != "{Dropped:2 Discarded:0 Handshakes:0 Challenges:0 Overruns:0 Expired:0 Rekeys:0 Probes:0 Credits:4}" {
		t.Fatalf("%s", got)
	}
}
