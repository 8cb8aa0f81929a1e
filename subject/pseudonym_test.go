package subject_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/subject"
)

// TestPrevious: the pseudonyms under the keys being rotated out are
// those of the older keys, newest first; with one key there are none.
func TestPrevious(t *testing.T) {
	one, err := subject.New([]subject.Key{{ID: "k1", Secret: []byte("first-secret-0123456789")}})
	if err != nil {
		t.Fatal(err)
	}
	if got := one.Previous("ip", "192.0.2.1", "GET /"); got != nil {
		t.Errorf("Previous with one key = %q, want nil", got)
	}
	three, err := subject.New([]subject.Key{
		{ID: "k3", Secret: []byte("third-secret-0123456789")},
		{ID: "k2", Secret: []byte("second-secret-0123456789")},
		{ID: "k1", Secret: []byte("first-secret-0123456789")},
	})
	if err != nil {
		t.Fatal(err)
	}
	two, err := subject.New([]subject.Key{{ID: "k2", Secret: []byte("second-secret-0123456789")}})
	if err != nil {
		t.Fatal(err)
	}
	prev := three.Previous("ip", "192.0.2.1", "GET /")
	if want := []string{two.Pseudonym("ip", "192.0.2.1", "GET /"), one.Pseudonym("ip", "192.0.2.1", "GET /")}; !slices.Equal(prev, want) || !strings.HasPrefix(prev[0], "k2:") {
		t.Errorf("Previous = %q, want k2's then k1's pseudonym, %q", prev, want)
	}
	if prev[1] != one.Pseudonym("ip", "192.0.2.1", "GET /") {
		t.Errorf("Previous under k1 = %q, want what a Pseudonymizer of k1 alone makes, %q", prev[1], one.Pseudonym("ip", "192.0.2.1", "GET /"))
	}
}

// TestPseudonymAllocatesOnlyItsResult holds Pseudonym to one allocation,
// the string it returns: the hash and its buffers are reused.
func TestPseudonymAllocatesOnlyItsResult(t *testing.T) {
	if raceEnabled {
		t.Skip("-race: sync.Pool drops items at random")
	}
	p, err := subject.New([]subject.Key{{ID: "k1", Secret: []byte("0123456789abcdef0123456789abcdef")}})
	if err != nil {
		t.Fatal(err)
	}
	p.Pseudonym("api", "warm-up", "")
	if n := testing.AllocsPerRun(100, func() { p.Pseudonym("api", "user-42", "GET /search") }); n > 1 {
		t.Errorf("Pseudonym allocates %v times, want 1", n)
	}
}
