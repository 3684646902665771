package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestDashboard: the Grafana dashboard under docs/ is valid JSON, and
// every series its queries name is one the collector exports, grouped
// only by labels the family has (a renamed metric would leave a panel
// silently empty).
func TestDashboard(t *testing.T) {
	b, err := os.ReadFile("../docs/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	byName := map[string]*family{}
	for _, f := range families {
		byName[f.name] = f
	}
	name := regexp.MustCompile(`udiwarp_[a-z0-9_]+`)
	by := regexp.MustCompile(`by \(([a-z_, ]+)\) \((?:rate\()?(udiwarp_[a-z0-9_]+)`)
	queries := 0
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			queries++
			for _, n := range name.FindAllString(q.Expr, -1) {
				if byName[n] == nil {
					t.Errorf("panel %q: %s is not a series the collector exports", p.Title, n)
				}
			}
			for _, m := range by.FindAllStringSubmatch(q.Expr, -1) {
				f := byName[m[2]]
				if f == nil {
					continue
				}
				for _, l := range strings.Split(m[1], ",") {
					if l = strings.TrimSpace(l); l != "device" && l != f.label {
						t.Errorf("panel %q: %s has no label %q", p.Title, f.name, l)
					}
				}
			}
		}
	}
	if queries == 0 {
		t.Fatal("no queries")
	}
}
