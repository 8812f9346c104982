package cloudevents

import "testing"

// TestValueRoundTrip: every UTF-8 string survives EncodeValue and
// DecodeValue, and the encoded form has no byte a header line would alter.
func TestValueRoundTrip(t *testing.T) {
	for _, s := range []string{"", "order", "a b", `"q"`, "100%", "é\r\n\t", "\x7f"} {
		enc := EncodeValue(s)
		for i := 0; i < len(enc); i++ {
			if needsEncoding(enc[i]) && enc[i] != '%' {
				t.Errorf("EncodeValue(%q) = %q keeps byte %#x", s, enc, enc[i])
			}
		}
		got, err := DecodeValue(enc)
		if err != nil || got != s {
			t.Errorf("DecodeValue(EncodeValue(%q)) = %q, %v", s, got, err)
		}
	}
	if got, err := DecodeValue("%c3%A9"); err != nil || got != "é" {
		t.Errorf("DecodeValue(lower-case hex) = %q, %v", got, err)
	}
}

// TestDecodeValueRejects: malformed escapes and text that is not UTF-8.
func TestDecodeValueRejects(t *testing.T) {
	for _, s := range []string{"%", "%4", "%zz", "a%4g", "\xff", "%FF", "%C3"} {
		if got, err := DecodeValue(s); err == nil {
			t.Errorf("DecodeValue(%q) = %q, accepted", s, got)
		}
	}
}
