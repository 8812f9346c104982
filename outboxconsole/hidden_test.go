package outboxconsole

import (
	"fmt"
	"testing"
)

// Security review of issue 19, item 11: every character that renders as
// nothing, reorders the text around it, or passes for another is shown as
// [U+XXXX] in ids, types and reasons; visible text is left alone. Before
// the fix the variation selectors, the combining grapheme joiner, Hangul
// fillers, line and paragraph separators, spaces other than U+0020 and the
// blank Braille pattern went through as they were.
func TestSafeTextEscapesEveryInvisibleCharacter(t *testing.T) {
	t.Parallel()
	for _, r := range []rune{
		0x00, 0x1B, 0x7F, 0x85, // controls
		0x00AD, 0x061C, 0x180E, 0x200B, 0x200C, 0x200D, 0x200E, 0x200F, // soft hyphen, ALM, MVS, ZW*, LRM/RLM
		0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2060, 0x2066, 0x2067, 0x2068, 0x2069, 0xFEFF, // bidi, WJ, BOM
		0xE0001, 0xE0020, 0xE0041, 0xE007F, // tag characters
		0xFE00, 0xFE0F, 0xE0100, 0xE01EF, 0x180B, // variation selectors
		0x034F, 0x115F, 0x1160, 0x3164, 0xFFA0, 0x17B4, // CGJ, Hangul fillers, Khmer inherent vowel
		0x2028, 0x2029, // line and paragraph separators
		0x00A0, 0x2000, 0x2007, 0x200A, 0x202F, 0x205F, 0x3000, 0x1680, // other spaces
		0x2800,         // blank Braille pattern
		0xE000, 0xF8FF, // private use
		0x0378, 0xE0000, 0xE0FFF, // unassigned
	} {
		want := fmt.Sprintf("a[U+%04X]b", r)
		if got := safeText("a" + string(r) + "b"); got != want {
			t.Errorf("U+%04X: %q, want %q", r, got, want)
		}
	}
	for _, s := range []string{"order-42", "Zoë Łódź", "注文", "a b\tc\nd", "½ €", "🙂", "x-y_z.w@v"} {
		if got := safeText(s); got != s {
			t.Errorf("%q shown as %q", s, got)
		}
	}
}
