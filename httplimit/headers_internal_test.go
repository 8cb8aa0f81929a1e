package httplimit

import (
	"testing"
	"time"
)

func TestAppendSFList(t *testing.T) {
	tests := []struct {
		name  string
		items []sfItem
		want  string
	}{
		{"one", []sfItem{{"api", []sfParam{{"q", 100}, {"w", 60}}}}, `"api";q=100;w=60`},
		{"two", []sfItem{{"a", []sfParam{{"r", 0}}}, {"b", nil}}, `"a";r=0, "b"`},
		{"escapes", []sfItem{{`a"b\c`, nil}}, `"a\"b\\c"`},
		{"non-printable replaced", []sfItem{{"a\x01\u00e9", nil}}, `"a???"`},
		{"integer clamped", []sfItem{{"x", []sfParam{{"t", 1 << 62}}}}, `"x";t=999999999999999`},
		{"empty", nil, ``},
	}
	for _, tt := range tests {
		if got := string(appendSFList(nil, tt.items)); got != tt.want {
			t.Errorf("%s: appendSFList(%v) = %s, want %s", tt.name, tt.items, got, tt.want)
		}
	}
}

func TestCeilSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		-time.Second: 0, 0: 0, time.Microsecond: 1, time.Second: 1,
		time.Second + time.Microsecond: 2, 7500 * time.Millisecond: 8, 10 * time.Second: 10,
	} {
		if got := ceilSeconds(d); got != want {
			t.Errorf("ceilSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}

func TestHasPathPrefix(t *testing.T) {
	for _, tt := range []struct {
		path, prefix string
		want         bool
	}{
		{"/api", "/api", true},
		{"/api/users", "/api", true},
		{"/apikeys", "/api", false},
		{"/", "/api", false},
		{"/v1/api", "/api", false},
	} {
		if got := hasPathPrefix(tt.path, tt.prefix); got != tt.want {
			t.Errorf("hasPathPrefix(%q, %q) = %v, want %v", tt.path, tt.prefix, got, tt.want)
		}
	}
}
