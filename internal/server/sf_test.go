package server_test

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// A small parser of Structured Field lists (RFC 9651 §4.2.1), enough to
// check the RateLimit fields as a client would read them: items of
// strings, tokens, integers and booleans with parameters. Inner lists,
// decimals and byte sequences are reported as errors since sluice never
// sends them.

type sfItem struct {
	Value  any // string (sf-string or token), int64 or bool
	Params []sfParam
}

type sfParam struct {
	Key   string
	Value any
}

func (it sfItem) param(key string) any {
	for _, p := range it.Params {
		if p.Key == key {
			return p.Value
		}
	}
	return nil
}

// mustParseList parses the one field line of name in h.
func mustParseList(t *testing.T, h http.Header, name string) []sfItem {
	t.Helper()
	lines := h.Values(name)
	if len(lines) != 1 {
		t.Fatalf("%s: %d field lines %q, want 1", name, len(lines), lines)
	}
	items, err := parseList(lines[0])
	if err != nil {
		t.Fatalf("%s: %q: %v", name, lines[0], err)
	}
	return items
}

type sfParser struct {
	s string
	i int
}

func parseList(s string) ([]sfItem, error) {
	p := &sfParser{s: s}
	p.skip(" ")
	var items []sfItem
	for p.i < len(p.s) {
		it, err := p.item()
		if err != nil {
			return nil, err
		}
		items = append(items, it)
		p.skip(" \t")
		if p.i == len(p.s) {
			return items, nil
		}
		if p.s[p.i] != ',' {
			return nil, fmt.Errorf("at %d: want ',' after a list member", p.i)
		}
		p.i++
		p.skip(" \t")
		if p.i == len(p.s) {
			return nil, fmt.Errorf("trailing comma")
		}
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("empty list")
	}
	return items, nil
}

func (p *sfParser) skip(chars string) {
	for p.i < len(p.s) && strings.IndexByte(chars, p.s[p.i]) >= 0 {
		p.i++
	}
}

func (p *sfParser) item() (sfItem, error) {
	v, err := p.bare()
	if err != nil {
		return sfItem{}, err
	}
	it := sfItem{Value: v}
	for p.i < len(p.s) && p.s[p.i] == ';' {
		p.i++
		p.skip(" ")
		key, err := p.key()
		if err != nil {
			return sfItem{}, err
		}
		var val any = true
		if p.i < len(p.s) && p.s[p.i] == '=' {
			p.i++
			if val, err = p.bare(); err != nil {
				return sfItem{}, err
			}
		}
		for _, q := range it.Params {
			if q.Key == key {
				return sfItem{}, fmt.Errorf("parameter %q twice", key)
			}
		}
		it.Params = append(it.Params, sfParam{key, val})
	}
	return it, nil
}

func (p *sfParser) key() (string, error) {
	start := p.i
	if p.i >= len(p.s) || !(p.s[p.i] == '*' || 'a' <= p.s[p.i] && p.s[p.i] <= 'z') {
		return "", fmt.Errorf("at %d: want a key", p.i)
	}
	for p.i < len(p.s) && (strings.IndexByte("_-.*", p.s[p.i]) >= 0 || 'a' <= p.s[p.i] && p.s[p.i] <= 'z' || '0' <= p.s[p.i] && p.s[p.i] <= '9') {
		p.i++
	}
	return p.s[start:p.i], nil
}

func (p *sfParser) bare() (any, error) {
	if p.i >= len(p.s) {
		return nil, fmt.Errorf("at %d: want an item", p.i)
	}
	switch c := p.s[p.i]; {
	case c == '"':
		var b strings.Builder
		for p.i++; p.i < len(p.s); p.i++ {
			switch c := p.s[p.i]; {
			case c == '\\':
				p.i++
				if p.i == len(p.s) || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
					return nil, fmt.Errorf("at %d: bad escape", p.i)
				}
				b.WriteByte(p.s[p.i])
			case c == '"':
				p.i++
				return b.String(), nil
			case c < 0x20 || c > 0x7e:
				return nil, fmt.Errorf("at %d: byte %#x in a string", p.i, c)
			default:
				b.WriteByte(c)
			}
		}
		return nil, fmt.Errorf("unterminated string")
	case c == '-' || '0' <= c && c <= '9':
		start := p.i
		p.i++
		for p.i < len(p.s) && '0' <= p.s[p.i] && p.s[p.i] <= '9' {
			p.i++
		}
		if p.i < len(p.s) && p.s[p.i] == '.' {
			return nil, fmt.Errorf("at %d: decimals are not expected", p.i)
		}
		if p.i-start > 15 {
			return nil, fmt.Errorf("integer %q has more than 15 digits", p.s[start:p.i])
		}
		return strconv.ParseInt(p.s[start:p.i], 10, 64)
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return p.s[p.i-1] == '1', nil
		}
		return nil, fmt.Errorf("at %d: bad boolean", p.i)
	case c == '*' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
		start := p.i
		for p.i < len(p.s) && (strings.IndexByte("!#$%&'*+-.^_`|~:/", p.s[p.i]) >= 0 || 'a' <= p.s[p.i] && p.s[p.i] <= 'z' || 'A' <= p.s[p.i] && p.s[p.i] <= 'Z' || '0' <= p.s[p.i] && p.s[p.i] <= '9') {
			p.i++
		}
		return p.s[start:p.i], nil
	}
	return nil, fmt.Errorf("at %d: unexpected %q", p.i, p.s[p.i])
}

func TestParseList(t *testing.T) {
	items, err := parseList(`"burst";q=100;w=60, "daily";q=1000;w=86400,tok;a;b=?0`)
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 3 || items[1].Value != "daily" || items[1].param("w") != int64(86400) || items[2].param("a") != true || items[2].param("b") != false {
		t.Errorf("parseList = %+v", items)
	}
	for _, bad := range []string{``, `"a",`, `"a";q=1.5`, `"a";q=1;q=2`, `"a" "b"`, `"a\n"`, `"a;q=1`} {
		if items, err := parseList(bad); err == nil {
			t.Errorf("parseList(%q) = %+v, want an error", bad, items)
		}
	}
}
