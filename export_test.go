package sluice

// GeneralPathOnly makes l validate every request the general way, for
// TestFastPathEqual to compare the fast path against.
func GeneralPathOnly(l *Limiter) { l.noFast = true }
