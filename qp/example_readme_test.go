package qp_test

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeExampleIsTheExample: README.md's "Use it" Go block is the
// body of Example (example_test.go), line for line, so the code a new
// user copies first is code the tests compile and run.
func TestReadmeExampleIsTheExample(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	ex, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	r := string(readme)
	i := strings.Index(r, "## Use it")
	if i < 0 {
		t.Fatal(`README.md has no "## Use it" section`)
	}
	r = r[i:]
	start := strings.Index(r, "```go\n")
	if start < 0 {
		t.Fatal(`README.md's "Use it" has no Go block`)
	}
	r = r[start+len("```go\n"):]
	block := r[:strings.Index(r, "```")]
	e := string(ex)
	e = e[strings.Index(e, "func Example() {\n")+len("func Example() {\n"):]
	e = e[:strings.Index(e, "\t// Output:")]
	var body []string
	for _, l := range strings.Split(strings.TrimRight(e, "\n"), "\n") {
		body = append(body, strings.TrimPrefix(l, "\t"))
	}
	if got, want := strings.TrimRight(block, "\n"), strings.Join(body, "\n"); got != want {
		t.Fatalf("README.md's example and Example's body differ:\n--- README\n%s\n--- example_test.go\n%s", got, want)
	}
}
