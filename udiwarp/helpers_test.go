package udiwarp

import (
	"errors"
	"testing"
)

func isErr(err, target error) bool { return err != nil && errors.Is(err, target) }

// mustCode checks that err wraps sentinel and carries Terminate code.
func mustCode(t *testing.T, err, sentinel error, code ErrorCode) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("err = %v, want %v", err, sentinel)
	}
	var fe *FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("err %v is not a *FieldError", err)
	}
	if code != 0 && fe.Code != code {
		t.Fatalf("err %v carries code %v (%#04x), want %v (%#04x)", err, fe.Code, uint16(fe.Code), code, uint16(code))
	}
	if fe.Error() == "" || fe.Field == "" || fe.Frame == "" {
		t.Fatalf("error %#v does not say what was wrong", fe)
	}
}
