package server

import (
	"net/http"
	"testing"
	"time"
)

// TestDateIsNetHTTPs holds the cached Date field to what net/http writes:
// http.TimeFormat in UTC, of the current second.
func TestDateIsNetHTTPs(t *testing.T) {
	before := time.Now().Truncate(time.Second)
	v := date()
	after := time.Now()
	if len(v) != 1 {
		t.Fatalf("date() = %q, want one value", v)
	}
	got, err := http.ParseTime(v[0])
	if err != nil || got.Before(before) || got.After(after) || v[0] != got.UTC().Format(http.TimeFormat) {
		t.Errorf("date() = %q (%v, %v), want http.TimeFormat of a second in [%v, %v]", v[0], got, err, before, after)
	}
}
