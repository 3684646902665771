// Package snapshot reads a struct of atomic counters into its plain
// twin: the struct internal/genstats writes, with the same exported
// fields in the same order, uint64 for atomic.Uint64 and arrays of them.
// Reflection, once per snapshot: it is read by people and metrics, never
// on a packet's path.
package snapshot

import (
	"fmt"
	"reflect"
	"sync/atomic"
)

var atomicU64 = reflect.TypeFor[atomic.Uint64]()

// Fill loads every exported counter of *src into the field of *dst with
// its name. It panics if the two do not match field for field, which
// each package's test of its snapshot type catches first (Match).
func Fill(dst, src any) {
	d, s := reflect.ValueOf(dst).Elem(), reflect.ValueOf(src).Elem()
	j := 0
	for i := range s.NumField() {
		f := s.Type().Field(i)
		if !f.IsExported() {
			continue
		}
		out := d.Field(j)
		j++
		switch {
		case f.Type == atomicU64:
			out.SetUint(s.Field(i).Addr().Interface().(*atomic.Uint64).Load())
		case f.Type.Kind() == reflect.Array && f.Type.Elem() == atomicU64:
			for k := range f.Type.Len() {
				out.Index(k).SetUint(s.Field(i).Index(k).Addr().Interface().(*atomic.Uint64).Load())
			}
		}
	}
}

// Match reports how the plain type plain (a struct value) differs from
// the counters' type counters, or nil: the same exported fields, names
// and order, uint64 for each atomic.Uint64, arrays of the same length.
func Match(plain, counters any) error {
	p, c := reflect.TypeOf(plain), reflect.TypeOf(counters)
	j := 0
	for i := range c.NumField() {
		f := c.Field(i)
		if !f.IsExported() {
			continue
		}
		if j >= p.NumField() {
			return fmt.Errorf("%s has no field for %s.%s: run go generate", p, c, f.Name)
		}
		g := p.Field(j)
		j++
		want := reflect.TypeFor[uint64]()
		if f.Type.Kind() == reflect.Array {
			want = reflect.ArrayOf(f.Type.Len(), want)
		} else if f.Type != atomicU64 {
			return fmt.Errorf("%s.%s is %s, not a counter", c, f.Name, f.Type)
		}
		if g.Name != f.Name || g.Type != want {
			return fmt.Errorf("%s.%s %s where %s has %s %s: run go generate", p, g.Name, g.Type, c, f.Name, want)
		}
	}
	if j != p.NumField() {
		return fmt.Errorf("%s has %d fields, %s %d counters: run go generate", p, p.NumField(), c, j)
	}
	return nil
}
