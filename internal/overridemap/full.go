package overridemap

import "fmt"

// Full is the error of a store asked to add an override while it holds
// its most (memstore's and redisstore's Options.MaxOverrides), so the
// server can answer it apart from a store that failed. Changing or
// removing one that is stored never meets it.
type Full struct {
	// Stored is how many overrides the store holds; Max, its bound.
	Stored, Max int
}

func (e *Full) Error() string {
	return fmt.Sprintf("%d overrides are stored: at most %d; remove one before adding another", e.Stored, e.Max)
}
