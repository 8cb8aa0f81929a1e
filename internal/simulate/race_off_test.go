//go:build !race

package simulate

// lqTestLimit is the limit TestSimulateLocalQuotaBound's table is aimed
// at: the doc's own without the race detector (race_on_test.go says why
// not with it).
const lqTestLimit = lqLimit

const raceEnabled = false
