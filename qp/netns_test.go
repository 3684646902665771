package qp

import (
	"testing"

	"github.com/udiwarp/udiwarp/internal/netnstest"
)

// newNetns and inNetns: a network namespace of the test's own
// (internal/netnstest).
func newNetns(t *testing.T, setup ...string) string {
	t.Helper()
	return netnstest.New(t, setup...)
}

func inNetns(t *testing.T, ns string, f func()) {
	t.Helper()
	netnstest.In(t, ns, f)
}
