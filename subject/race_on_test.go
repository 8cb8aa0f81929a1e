//go:build race

package subject_test

// raceEnabled reports a -race build, where sync.Pool drops items at
// random on purpose, so allocation counts are not the real ones.
const raceEnabled = true
