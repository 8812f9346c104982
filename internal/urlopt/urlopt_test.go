package urlopt

import "testing"

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
