package config

import (
	"testing"

	"github.com/sluicehq/sluice/subject"
)

// TestSecretBoundIsSubjects: the shortest secret the config takes is the
// shortest subject.New takes.
func TestSecretBoundIsSubjects(t *testing.T) {
	for _, n := range []int{minSecretLen - 1, minSecretLen} {
		_, err := subject.New([]subject.Key{{ID: "k1", Secret: make([]byte, n)}})
		if got, want := err == nil, n >= minSecretLen; got != want {
			t.Errorf("subject.New with a %d-byte secret: err = %v, want accepted = %v", n, err, want)
		}
	}
}
