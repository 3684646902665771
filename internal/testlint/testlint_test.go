package testlint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// postVerbs are the methods that post work and return an error: qp's
// (*QP).PostSend, (*QP).PostRecv and (*SRQ).PostRecv, PostSRQRecv should
// one be added, socketshim/rds's (*Socket).SendMsg, which posts a send,
// and reliability's (*Endpoint).Post, which posts a message. Calls are matched by the method's name, not its receiver's type,
// so a method of another type with one of these names is held to the
// same rule.
var postVerbs = []string{"PostSend", "PostRecv", "PostSRQRecv", "SendMsg", "Post"}

// ignoredMark begins the comment that lets an assignment of a posting
// verb's error to _ stand. See TestPostResultsChecked.
const ignoredMark = "error ignored:"

// A finding is a call that drops a posting verb's error.
type finding struct {
	pos  token.Position
	verb string
	how  string
}

func (f finding) String() string {
	return f.pos.String() + ": " + f.verb + " " + f.how
}

// postVerb reports the verb e calls, if it is a call of one.
func postVerb(e ast.Expr) (string, bool) {
	call, ok := ast.Unparen(e).(*ast.CallExpr)
	if !ok {
		return "", false
	}
	sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr)
	if !ok || !slices.Contains(postVerbs, sel.Sel.Name) {
		return "", false
	}
	return sel.Sel.Name, true
}

func isBlank(e ast.Expr) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == "_"
}

// uncheckedPosts returns the calls in f that drop a posting verb's
// error: as a statement of its own, in go or defer, or with the error
// assigned to _ when no comment beginning with ignoredMark and giving a
// reason lies on the statement's lines.
func uncheckedPosts(fset *token.FileSet, f *ast.File) []finding {
	// marked holds the lines that carry an ignoredMark comment.
	marked := map[int]bool{}
	for _, g := range f.Comments {
		for _, c := range g.List {
			text := strings.TrimSpace(strings.TrimPrefix(c.Text, "//"))
			if rest, ok := strings.CutPrefix(text, ignoredMark); ok && strings.TrimSpace(rest) != "" {
				marked[fset.Position(c.Slash).Line] = true
			}
		}
	}
	explained := func(n ast.Node) bool {
		for l := fset.Position(n.Pos()).Line; l <= fset.Position(n.End()).Line; l++ {
			if marked[l] {
				return true
			}
		}
		return false
	}
	var out []finding
	add := func(e ast.Expr, how string) {
		if verb, ok := postVerb(e); ok {
			out = append(out, finding{fset.Position(e.Pos()), verb, how})
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch s := n.(type) {
		case *ast.ExprStmt:
			add(s.X, "result discarded")
		case *ast.GoStmt:
			add(s.Call, "result discarded by go")
		case *ast.DeferStmt:
			add(s.Call, "result discarded by defer")
		case *ast.AssignStmt:
			// The error is the call's last result, so the last on the left.
			if len(s.Rhs) == 1 && len(s.Lhs) > 0 && isBlank(s.Lhs[len(s.Lhs)-1]) && !explained(s) {
				add(s.Rhs[0], "error assigned to _ without a \"// "+ignoredMark+" <reason>\" comment")
			}
		}
		return true
	})
	return out
}

// TestPostResultsChecked fails for each call in the module's test files
// that drops the error of a posting verb (postVerbs), naming its file
// and line. A post that fails without the test noticing shows up, if at
// all, as a completion that never arrives: a timeout, far from its
// cause. So a test checks each post's error: t.Fatal (or t.Error from a
// goroutine) when it must succeed, errors.Is against the error it
// expects when it must fail.
//
// Where either result is fine (a post racing a Close in a stress loop),
// the test says so: it assigns the error to _ and puts, on the
// statement's first or last line, a comment that begins with
// "error ignored:" and gives the reason:
//
//	_ = q.PostSend(wr) // error ignored: racing Close; either result is fine
//
// A bare call, a go or defer of one, or a blank assignment without that
// comment fails the test.
func TestPostResultsChecked(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (d.Name() == "testdata" || d.Name() == "vendor" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		for _, fd := range uncheckedPosts(fset, f) {
			if rel, err := filepath.Rel(root, fd.pos.Filename); err == nil {
				fd.pos.Filename = rel
			}
			t.Errorf("%v", fd)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The walk must have reached the module's tests: qp's alone are dozens.
	if files < 50 {
		t.Fatalf("read only %d test files under %s", files, root)
	}
}

// TestUncheckedPosts checks the checker on sources of its own.
func TestUncheckedPosts(t *testing.T) {
	const src = `package p

func f(q, s *QP, wr *SendWR, rwr *RecvWR) {
	q.PostSend(wr)                 // line 4: flagged
	(s.srq).PostRecv(rwr)          // line 5: flagged
	go q.PostSend(wr)              // line 6: flagged
	defer q.PostRecv(rwr)          // line 7: flagged
	_ = q.PostSend(wr)             // line 8: flagged, no reason
	_ = q.PostSend(wr)             // error ignored:
	n, _ := s.SendMsg(nil, addr)   // line 10: flagged
	_ = q.PostSend(&SendWR{        // error ignored: a racing Close
		ID: 1,
	})
	_ = q.PostSend(&SendWR{
		ID: 2,
	}) // error ignored: a racing Close
	if err := q.PostSend(wr); err != nil {
		panic(err)
	}
	err := q.PostRecv(rwr)
	n, err = s.SendMsg(nil, addr)
	_ = q.Modify(attr)
	q.Modify(wr)
	PostSend(wr)
	_, _ = s.SendMsg(nil, addr) // error ignored: the peer may be gone
	_ = q.PostRecv(rwr)
	// error ignored: a comment on the line above does not count
	_ = q.PostRecv(rwr)
}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p_test.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, fd := range uncheckedPosts(fset, f) {
		got = append(got, fd.pos.Line)
	}
	want := []int{4, 5, 6, 7, 8, 9, 10, 26, 28}
	if !slices.Equal(got, want) {
		t.Errorf("flagged lines %v, want %v", got, want)
	}
}
