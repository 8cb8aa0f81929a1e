package sfparse

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseList(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   string
		want []Member
	}{
		{"empty", ``, nil},
		{"only spaces", `   `, nil},
		{"ratelimit policy", `"burst";q=100;w=60, "daily";q=1000;w=86400`, []Member{
			{Value: "burst", Params: []Param{{"q", int64(100)}, {"w", int64(60)}}},
			{Value: "daily", Params: []Param{{"q", int64(1000)}, {"w", int64(86400)}}},
		}},
		{"trailing OWS", "a\t", []Member{{Value: Token("a")}}},
		{"no space after comma, tabs before", "a,\tb", []Member{{Value: Token("a")}, {Value: Token("b")}}},
		{"leading spaces", `  1`, []Member{{Value: int64(1)}}},
		{"token with colon and slash", `text/html;q=0.5`, []Member{{Value: Token("text/html"), Params: []Param{{"q", Decimal(500)}}}}},
		{"star token", `*/*`, []Member{{Value: Token("*/*")}}},
		{"negative integer", `-42`, []Member{{Value: int64(-42)}}},
		{"fifteen digits", `999999999999999`, []Member{{Value: int64(999999999999999)}}},
		{"decimal", `-1.25, 123456789012.123`, []Member{{Value: Decimal(-1250)}, {Value: Decimal(123456789012123)}}},
		{"escapes", `"a\"b\\c"`, []Member{{Value: `a"b\c`}}},
		{"booleans and bare keys", `x;a;b=?0;c=?1`, []Member{{Value: Token("x"), Params: []Param{{"a", true}, {"b", false}, {"c", true}}}}},
		{"byte sequence", `:aGVsbG8=:, ::`, []Member{{Value: []byte("hello")}, {Value: []byte{}}}},
		{"date", `@1659578233`, []Member{{Value: Date(1659578233)}}},
		{"display string", `%"f%c3%bc%c3%bc"`, []Member{{Value: DisplayString("füü")}}},
		{"inner lists", `("a" "b");x=1, (), (1 2)`, []Member{
			{Value: InnerList{Items: []Item{{Value: "a"}, {Value: "b"}}, Params: []Param{{"x", int64(1)}}}, Params: []Param{{"x", int64(1)}}},
			{Value: InnerList{}},
			{Value: InnerList{Items: []Item{{Value: int64(1)}, {Value: int64(2)}}}},
		}},
		{"repeated parameter replaces in place", `"a";q=1;w=2;q=3`, []Member{{Value: "a", Params: []Param{{"q", int64(3)}, {"w", int64(2)}}}}},
		{"space after semicolon", `"a"; q=1`, []Member{{Value: "a", Params: []Param{{"q", int64(1)}}}}},
	} {
		got, err := ParseList(tt.in)
		if err != nil {
			t.Errorf("%s: ParseList(%q) = %v", tt.name, tt.in, err)
			continue
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s: ParseList(%q) mismatch (-want +got):\n%s", tt.name, tt.in, diff)
		}
	}
}

func TestParseListRejects(t *testing.T) {
	for _, in := range []string{
		`"a",`,             // trailing comma
		`,"a"`,             // leading comma
		`"a" "b"`,          // no comma
		`"a";q=1.5.`,       // junk after a member
		`1.`,               // decimal without fraction
		`1.2345`,           // four fractional digits
		`1234567890123.0`,  // thirteen integer digits
		`1234567890123456`, // sixteen digits
		`-`,                // sign alone
		`"a`,               // unterminated string
		`"a\n"`,            // bad escape
		"\"a\x01\"",        // control byte in a string
		"\"caf\u00e9\"",    // non-ASCII
		`"a";Q=1`,          // upper-case key
		`"a";1=1`,          // key starting with a digit
		`"a";q=`,           // missing value
		`?2`,               // bad boolean
		`:aGVsbG8`,         // unterminated byte sequence
		`:a*b:`,            // bad base64 character
		`@1.5`,             // fractional date
		`%"a%C3"`,          // upper-case hex in a display string
		`%"%ff"`,           // invalid UTF-8
		`%a`,               // % not followed by a quote
		`(1 2`,             // unterminated inner list
		`(1,2)`,            // comma inside an inner list
		`"a" ;q=1`,         // space before a parameter
		`&`,                // not a bare item
		`"a",, "b"`,        // empty member
	} {
		if got, err := ParseList(in); err == nil {
			t.Errorf("ParseList(%q) = %+v, want an error", in, got)
		}
	}
}

func TestParseFieldLines(t *testing.T) {
	got, err := ParseFieldLines([]string{`"a";r=1`, `"b";r=2`})
	if err != nil {
		t.Fatal(err)
	}
	want := []Member{{Value: "a", Params: []Param{{"r", int64(1)}}}, {Value: "b", Params: []Param{{"r", int64(2)}}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParseFieldLines mismatch (-want +got):\n%s", diff)
	}
	if got, err := ParseFieldLines(nil); err != nil || got != nil {
		t.Errorf("ParseFieldLines(nil) = %v, %v; want an empty list", got, err)
	}
}

func TestMemberParam(t *testing.T) {
	m := Member{Value: "a", Params: []Param{{"q", int64(3)}}}
	if v, ok := m.Param("q"); !ok || v != int64(3) {
		t.Errorf("Param(q) = %v, %v; want 3, true", v, ok)
	}
	if v, ok := m.Param("w"); ok {
		t.Errorf("Param(w) = %v, true; want absent", v)
	}
}

func FuzzParseList(f *testing.F) {
	for _, s := range []string{`"a";q=1;w=2, "b";r=0;t=10`, `(1 2);a, ?1`, `:aGk=:`, `%"%c3%a9"`, `1.5`, `@0`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		// Never panics; whatever parses, parses again the same way.
		got, err := ParseList(s)
		if err != nil {
			return
		}
		again, err := ParseList(s)
		if err != nil || !cmp.Equal(got, again) {
			t.Fatalf("ParseList(%q) is not deterministic", s)
		}
	})
}
