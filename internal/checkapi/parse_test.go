package checkapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// decodeJSON is what the server does with a body ParseRequest declines:
// one object of Request's fields, nothing after it.
func decodeJSON(b []byte) (Request, bool) {
	var in Request
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if dec.Decode(&in) != nil {
		return Request{}, false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Request{}, false
	}
	return in, true
}

// parseRequestSeeds are bodies ParseRequest must read as encoding/json
// does (fast) or decline (the rest).
var parseRequestSeeds = []struct {
	body string
	fast bool
}{
	{`{"policy":"open","subject":"user-1"}`, true},
	{` { "policy" : "open" ,` + "\n\t\r" + ` "subject" : "user-1" } ` + "\n", true},
	{`{}`, true},
	{`{"policies":["a","b"],"subject":"s","cost":2,"refund":true,"reset":false,"evaluation_id":"e","lease_id":"l","op":"settle"}`, true},
	{`{"policy":"p","subject":"s","cost":2,"op":"book","max_wait_ms":250}`, true},
	{`{"policy":"p","subject":"s","op":"book","max_wait_ms":2.5}`, false},
	{`{"policies":[],"subject":"s"}`, true},
	{`{"subject":"s","cost":0}`, true},
	{`{"subject":"s","cost":-3}`, true},
	{`{"subject":"s","cost":-0}`, true},
	{`{"subject":"s","cost":999999999999999999}`, true},
	{`{"subject":"héllo wörld ✓"}`, true},
	{`{"subject":"s","cost":9223372036854775807}`, false},
	{`{"subject":"s","cost":9223372036854775808}`, false},
	{`{"subject":"s","cost":01}`, false},
	{`{"subject":"s","cost":1.5}`, false},
	{`{"subject":"s","cost":1e3}`, false},
	{`{"subject":"s","cost":-}`, false},
	{`{"subject":"s","cost":null}`, false},
	{`{"subject":"s","cost":"1"}`, false},
	{`{"subject":"s\"q"}`, false},
	{`{"subject":"s\u0041"}`, false},
	{"{\"subject\":\"a\x01b\"}", false},
	{"{\"subject\":\"a\xffb\"}", false},
	{`{"Subject":"s"}`, false},
	{`{"subject":"s","subject":"t"}`, false},
	{`{"subject":"s","other":1}`, false},
	{`{"subject":"s"} {}`, false},
	{`{"subject":"s"}x`, false},
	{`{"subject":"s",}`, false},
	{`{"subject":"s"`, false},
	{`{"subject":"s]`, false},
	{`{"subject"}`, false},
	{`{"refund":truex}`, false},
	{`{"refund":tru}`, false},
	{`{"refund":1}`, false},
	{`{"policies":["a",]}`, false},
	{`{"policies":["a" "b"]}`, false},
	{`{"policies":"a"}`, false},
	{`{"policies":[1]}`, false},
	{`[]`, false},
	{``, false},
	{`null`, false},
}

func TestParseRequestAgreesWithEncodingJSON(t *testing.T) {
	for _, c := range parseRequestSeeds {
		var got Request
		fast := ParseRequest([]byte(c.body), &got)
		if fast != c.fast {
			t.Errorf("ParseRequest(%q) = %v, want %v", c.body, fast, c.fast)
		}
		if !fast {
			continue
		}
		want, ok := decodeJSON([]byte(c.body))
		if !ok {
			t.Errorf("ParseRequest(%q) read a body encoding/json refuses", c.body)
			continue
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("ParseRequest(%q): (-encoding/json +ParseRequest)\n%s", c.body, diff)
		}
	}
}

// FuzzParseRequest holds ParseRequest to encoding/json on any body: where
// it reads one, encoding/json reads the same.
func FuzzParseRequest(f *testing.F) {
	for _, c := range parseRequestSeeds {
		f.Add([]byte(c.body))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var got Request
		if !ParseRequest(b, &got) {
			return
		}
		want, ok := decodeJSON(b)
		if !ok {
			t.Fatalf("ParseRequest(%q) read a body encoding/json refuses", b)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("ParseRequest(%q): (-encoding/json +ParseRequest)\n%s", b, diff)
		}
	})
}
