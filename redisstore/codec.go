package redisstore

import (
	"strconv"

	"github.com/sluicehq/sluice"
)

// What the decision code and this package say to each other beside the
// decision's numbers, the Go twin of lua/codec.lua: the integers this
// package writes as arguments (intArg; the script's arg reads them) and
// the error replies the script raises (raise, corrupt and read; Store.classify
// reads them through scriptError). The stored form of a fixed-size state
// is the script's alone: Go neither reads nor writes it.

// scriptError returns the sentinel of an error reply the script raised,
// by its code (codec.lua's raise: "SLUICE_CORRUPT", "SLUICE_CLOCK" or
// "SLUICE_ARGS"), or nil for any other code.
func scriptError(code string) error {
	switch code {
	case "SLUICE_CORRUPT":
		return sluice.CorruptState
	case "SLUICE_CLOCK":
		return sluice.ClockUnsafe
	case "SLUICE_ARGS":
		return sluice.ErrInvalidRequest
	}
	return nil
}

// smallInts holds "0" to "255" as interface values, for the counts and
// costs most decisions send.
var smallInts = func() (v [256]any) {
	for i := range v {
		v[i] = strconv.Itoa(i)
	}
	return v
}()

// intArg returns n as an argument, without allocating for 0 to 255.
func intArg(n int64) any {
	if n >= 0 && n < int64(len(smallInts)) {
		return smallInts[n]
	}
	return strconv.FormatInt(n, 10)
}
