package algorithm

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Priority classes on one budget: a policy may give each class a share of
// its capacity (Params.Capacity), in percent, and a request of that class
// is decided with the rest held back (Params.Reserve), on the same state,
// in the same decision as every other class. The names and numbers are
// checked here once, for the library, the config and the check API.

// DefaultClass is the class of a request that names none.
const DefaultClass = "default"

// MaxClasses bounds the classes one policy declares.
const MaxClasses = 8

// ShareOf returns the percent of the capacity a request of class may use
// under shares (class name → percent): its share, 100 for a class shares
// does not name. "" is DefaultClass.
func ShareOf(shares map[string]int, class string) int {
	if class == "" {
		class = DefaultClass
	}
	if s, ok := shares[class]; ok {
		return s
	}
	return 100
}

// Reserve returns the Params.Reserve of a request that may use share
// percent of capacity: capacity − ⌊capacity × share / 100⌋, leaving the
// class at least one unit (a capacity lowered by an override must not
// make a class Incompatible; Policy validation holds the policy's own
// numbers to a ceiling of 1 or more).
func Reserve(capacity int64, share int) int64 {
	if share >= 100 || share < 0 {
		return 0
	}
	ceiling := max(capacity*int64(share)/100, 1)
	return capacity - ceiling
}

// ClassName reports whether name may name a class: 1 to 32 of [a-z0-9_-].
func ClassName(name string) bool {
	if len(name) < 1 || len(name) > 32 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// CheckShares reports, through bad (field, value as written, rule), the
// first class of shares that breaks a rule, for a policy of capacity
// units: at most MaxClasses classes, each named by ClassName, with a
// share of 1 to 100 percent that leaves it at least one unit.
func CheckShares(shares map[string]int, capacity int64, bad func(field, value, rule string) error) error {
	if len(shares) > MaxClasses {
		return bad("priorities", fmt.Sprint(len(shares), " classes"), fmt.Sprintf("at most %d classes", MaxClasses))
	}
	for _, name := range Classes(shares) {
		share := shares[name]
		field := "priorities." + name
		switch {
		case !ClassName(name):
			return bad("priorities", fmt.Sprintf("%q", name), "a class name is 1 to 32 characters of a-z 0-9 _ -")
		case share < 1 || share > 100:
			return bad(field, fmt.Sprint(share, "%"), "must be between 1% and 100% of the policy's capacity")
		case capacity*int64(share)/100 < 1:
			return bad(field, fmt.Sprint(share, "%"), fmt.Sprintf("leaves this class no unit of the policy's capacity of %d: raise the share to at least %d%%", capacity, (100+capacity-1)/capacity))
		}
	}
	return nil
}

// Classes returns the class names of shares, sorted.
func Classes(shares map[string]int) []string {
	names := make([]string, 0, len(shares))
	for name := range shares {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// ErrUnknownClass is wrapped, beside ErrInvalidRequest, by UnknownClass's
// error: the request is well formed but names a class the policies do
// not declare, which the check API answers 422 (a malformed request is
// its 400).
var ErrUnknownClass = errors.New("unknown priority class")

// UnknownClass returns the error for a request's class that none of
// known (sorted) declares: ErrInvalidRequest and ErrUnknownClass.
func UnknownClass(class string, known []string) error {
	rule := "no policy declares priority classes: leave it empty"
	if len(known) > 0 {
		rule = "must be empty or a class a policy declares: " + strings.Join(known, ", ")
	}
	return &classError{fmt.Sprintf("%v: priority = %q: %s", ErrInvalidRequest, class, rule)}
}

// classError is UnknownClass's error.
type classError struct{ msg string }

func (e *classError) Error() string   { return e.msg }
func (e *classError) Unwrap() []error { return []error{ErrInvalidRequest, ErrUnknownClass} }
