package config

import (
	"testing"

	"github.com/sluicehq/sluice/subject"
)

// TestKeyIDsMatchSubject keeps validKeyID in step with subject.New, whose
// rule it mirrors so that sluice validate catches bad ids without secrets.
func TestKeyIDsMatchSubject(t *testing.T) {
	secret := make([]byte, subject.MinSecretLen)
	for _, id := range []string{"", "k1", "a", "0", "abcdefghijklmnop", "abcdefghijklmnopq", "K1", "k-1", "k_1", "k 1", "ké", "k1\n"} {
		_, err := subject.New([]subject.Key{{ID: id, Secret: secret}})
		if got, want := validKeyID(id), err == nil; got != want {
			t.Errorf("validKeyID(%q) = %v, but subject.New accepts it: %v", id, got, want)
		}
	}
}
