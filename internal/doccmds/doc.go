// Package doccmds holds the test that keeps the shell commands of
// README.md, docs/ and experiments/README.md runnable as written: it
// runs those that can run in a test and names, for each of the others,
// why not. A command it does not know fails it, so a doc cannot grow one
// that nobody ran.
package doccmds
