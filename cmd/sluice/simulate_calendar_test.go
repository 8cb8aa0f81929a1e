package main

import (
	"os"
	"strings"
	"testing"
)

// TestAccuracyDocCalendar: ACCURACY.md's calendar table is what
// simulate --pattern calendar prints today.
func TestAccuracyDocCalendar(t *testing.T) {
	stdout, code, stderr := sim(t, "--pattern", "calendar")
	if code != 0 {
		t.Fatalf("simulate --pattern calendar = exit %d\n%s", code, stderr)
	}
	doc, err := os.ReadFile("../../ACCURACY.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), stdout) {
		t.Errorf("ACCURACY.md does not hold the table simulate --pattern calendar prints:\n%s\nregenerate with: go run ./cmd/sluice simulate --pattern calendar, and paste it into ACCURACY.md", stdout)
	}
	if _, code, stderr := sim(t, "--pattern", "calendar", "--window", "1m"); code != 2 || !strings.Contains(stderr, "--window does not apply to the calendar pattern") {
		t.Errorf("simulate --pattern calendar --window 1m = exit %d, %q; want 2 naming --window", code, stderr)
	}
}
