package server

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", `quote " backslash \`, "nl\n tab\t cr\r nul\x00 esc\x1b", "é ü 漢字", "\xff\xfe bad", "line\u2028sep\u2029", "<script>&"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := appendString(nil, s)
		var got string
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("appendString(%q) = %s: not JSON: %v", s, b, err)
		}
		if want := strings.ToValidUTF8(s, "\ufffd"); got != want && !(!utf8.ValidString(s) && got == invalidToReplacement(s)) {
			t.Fatalf("appendString(%q) decodes to %q, want %q", s, got, want)
		}
	})
}

// invalidToReplacement replaces every invalid byte with U+FFFD, as
// appendString does (strings.ToValidUTF8 merges runs of them).
func invalidToReplacement(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteString("\ufffd")
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}
