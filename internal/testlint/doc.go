// Package testlint holds tests that read the module's own test files and
// fail on a pattern that makes a failure hard to see: so far, a test that
// drops the error of a posting verb (a failed post then shows up only as
// a completion that never comes, a timeout far from its cause).
package testlint
