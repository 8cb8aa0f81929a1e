package failure_test

import (
	"fmt"

	"github.com/sluicehq/sluice/failure"
)

// A mode prints as the config spells it (failure_mode: open).
func ExampleMode_String() {
	fmt.Println(failure.Closed, failure.Open, failure.Local)
	// Output: closed open local
}
