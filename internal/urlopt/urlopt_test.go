package urlopt

import (
	"strings"
	"testing"
)

func TestValues(t *testing.T) {
	if d, err := Duration("1500ms"); err != nil || d.Milliseconds() != 1500 {
		t.Errorf("Duration(1500ms) = %v, %v", d, err)
	}
	if n, err := Int("16"); err != nil || n != 16 {
		t.Errorf("Int(16) = %v, %v", n, err)
	}
	if n, err := Int64("65536"); err != nil || n != 65536 {
		t.Errorf("Int64(65536) = %v, %v", n, err)
	}
	for _, v := range []string{"0s", "-1s", "ten", ""} {
		if _, err := Duration(v); err == nil {
			t.Errorf("Duration(%q) accepted", v)
		}
	}
	for _, v := range []string{"0", "-3", "1.5", "x", ""} {
		if _, err := Int(v); err == nil {
			t.Errorf("Int(%q) accepted", v)
		}
		if _, err := Int64(v); err == nil {
			t.Errorf("Int64(%q) accepted", v)
		}
	}
}

// TestErrorsDoNotQuoteTheValue: a refused value may be anything, a
// misplaced password included; the error says what is wrong without it.
func TestErrorsDoNotQuoteTheValue(t *testing.T) {
	const v = "pw-S3CRET"
	_, e1 := Duration(v)
	_, e2 := Int(v)
	_, e3 := Int64(v)
	_, e4 := Bool(v)
	for _, err := range []error{e1, e2, e3, e4} {
		if err == nil || strings.Contains(err.Error(), "S3CRET") {
			t.Errorf("error %v: want one that does not quote the value", err)
		}
	}
	if b, err := Bool("false"); err != nil || b {
		t.Errorf("Bool(false) = %v, %v", b, err)
	}
}
