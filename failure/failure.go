// Package failure names what an edge answers when the store cannot decide
// (an Unavailable or Indeterminate sluice.Outcome): a property of the
// edge's rule (httplimit.Route, grpclimit.Method, the server's
// failure_mode per policy), not of a policy's math, shared by every
// edge. The outcome itself stays honest: the mode says only what the edge
// does with it.
package failure

import "fmt"

// Mode says what an edge answers when the store cannot decide. Its String
// form is the config spelling.
type Mode uint8

// The modes. The zero value is Closed.
const (
	Closed Mode = iota // closed: answer 503 (gRPC: Unavailable), admit nothing
	Open               // open: admit, count, log
	Local              // local: fall back to an embedded limiter with a local share
)

var modeNames = [...]string{Closed: "closed", Open: "open", Local: "local"}

// String returns the config spelling, e.g. "closed".
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("FailureMode(%d)", uint8(m)) // the field it is read from, as messages name it
}
