package ratelimitheader

import (
	"testing"
	"time"
)

func TestAppendSFString(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"api", `"api"`},
		{`a"b\c`, `"a\"b\\c"`},
		{"a\x01\u00e9", `"a???"`},
		{"", `""`},
	} {
		if got := string(appendSFString(nil, tt.in)); got != tt.want {
			t.Errorf("appendSFString(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

func TestAppendSFIntegerClamps(t *testing.T) {
	for n, want := range map[int64]string{0: "0", -7: "-7", 1 << 62: "999999999999999", -1 << 62: "-999999999999999"} {
		if got := string(appendSFInteger(nil, n)); got != want {
			t.Errorf("appendSFInteger(%d) = %s, want %s", n, got, want)
		}
	}
}

func TestCeilSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		-time.Second: 0, 0: 0, time.Microsecond: 1, time.Second: 1,
		time.Second + time.Microsecond: 2, 7500 * time.Millisecond: 8, 10 * time.Second: 10,
	} {
		if got := CeilSeconds(d); got != want {
			t.Errorf("CeilSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}
