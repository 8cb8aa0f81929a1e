//go:build race

package simulate

// lqTestLimit is the limit TestSimulateLocalQuotaBound's table is aimed
// at. Under the race detector the doc's table (LocalQuotaLimit) takes
// minutes on two cores, so it is run at 1000 there, the rows still
// worked on every CPU at once; make test runs the doc's table without
// -race in a step of its own (TestAccuracyDocLocalQuota), which proves
// the numbers, not the concurrency.
const lqTestLimit = 1000

const raceEnabled = true
