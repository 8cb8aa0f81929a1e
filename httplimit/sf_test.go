package httplimit_test

import (
	"fmt"
	"strconv"
)

// A strict RFC 9651 List parser (section 4.2.1), enough to check what the
// middleware writes: Items whose bare items are Integers, Strings, Tokens
// or Booleans, with parameters. It does not trust the serializer under
// test: every byte must be where the grammar allows it.

type sfToken string

type sfParam struct {
	Key   string
	Value any // int64, string, sfToken, bool
}

type sfMember struct {
	Value  any
	Params []sfParam
}

type sfParser struct {
	s string
	i int
}

func parseSFList(s string) ([]sfMember, error) {
	p := &sfParser{s: s}
	p.skipSP()
	var out []sfMember
	if p.i == len(p.s) {
		return nil, nil
	}
	for {
		m, err := p.item()
		if err != nil {
			return nil, err
		}
		out = append(out, m)
		p.skipOWS()
		if p.i == len(p.s) {
			return out, nil
		}
		if p.s[p.i] != ',' {
			return nil, fmt.Errorf("at %d: want ',' after list member, got %q", p.i, p.s[p.i])
		}
		p.i++
		p.skipOWS()
		if p.i == len(p.s) {
			return nil, fmt.Errorf("trailing comma")
		}
	}
}

func (p *sfParser) skipSP() {
	for p.i < len(p.s) && p.s[p.i] == ' ' {
		p.i++
	}
}

func (p *sfParser) skipOWS() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *sfParser) item() (sfMember, error) {
	v, err := p.bare()
	if err != nil {
		return sfMember{}, err
	}
	m := sfMember{Value: v}
	for p.i < len(p.s) && p.s[p.i] == ';' {
		p.i++
		p.skipSP()
		key, err := p.key()
		if err != nil {
			return sfMember{}, err
		}
		var val any = true
		if p.i < len(p.s) && p.s[p.i] == '=' {
			p.i++
			if val, err = p.bare(); err != nil {
				return sfMember{}, err
			}
		}
		m.Params = append(m.Params, sfParam{key, val})
	}
	return m, nil
}

func (p *sfParser) key() (string, error) {
	start := p.i
	if p.i == len(p.s) || !(isLCAlpha(p.s[p.i]) || p.s[p.i] == '*') {
		return "", fmt.Errorf("at %d: a key must start with a-z or '*'", p.i)
	}
	for p.i < len(p.s) {
		c := p.s[p.i]
		if !(isLCAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
		p.i++
	}
	return p.s[start:p.i], nil
}

func (p *sfParser) bare() (any, error) {
	if p.i == len(p.s) {
		return nil, fmt.Errorf("at %d: want a bare item, got the end", p.i)
	}
	switch c := p.s[p.i]; {
	case c == '-' || isDigit(c):
		return p.integer()
	case c == '"':
		return p.str()
	case c == '*' || isAlpha(c):
		return p.token(), nil
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return p.s[p.i-1] == '1', nil
		}
		return nil, fmt.Errorf("at %d: bad boolean", p.i)
	default:
		return nil, fmt.Errorf("at %d: unexpected %q", p.i, c)
	}
}

func (p *sfParser) integer() (int64, error) {
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	digits := p.i
	for p.i < len(p.s) && isDigit(p.s[p.i]) {
		p.i++
	}
	if n := p.i - digits; n == 0 || n > 15 {
		return 0, fmt.Errorf("at %d: an integer has 1 to 15 digits", start)
	}
	if p.i < len(p.s) && p.s[p.i] == '.' {
		return 0, fmt.Errorf("at %d: decimal where an integer was expected", p.i)
	}
	return strconv.ParseInt(p.s[start:p.i], 10, 64)
}

func (p *sfParser) str() (string, error) {
	p.i++ // the opening quote
	var b []byte
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.i == len(p.s) || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
				return "", fmt.Errorf("at %d: bad escape", p.i)
			}
			b = append(b, p.s[p.i])
			p.i++
		case c == '"':
			return string(b), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("at %d: byte %#x in a string", p.i-1, c)
		default:
			b = append(b, c)
		}
	}
	return "", fmt.Errorf("unterminated string")
}

func (p *sfParser) token() sfToken {
	start := p.i
	p.i++
	for p.i < len(p.s) {
		c := p.s[p.i]
		if !(isAlpha(c) || isDigit(c) || c == ':' || c == '/' || isTcharPunct(c)) {
			break
		}
		p.i++
	}
	return sfToken(p.s[start:p.i])
}

func isLCAlpha(c byte) bool { return 'a' <= c && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || 'A' <= c && c <= 'Z' }
func isDigit(c byte) bool   { return '0' <= c && c <= '9' }
func isTcharPunct(c byte) bool {
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

// ratePolicy is one member of RateLimit-Policy or RateLimit, as parsed.
func member(id string, params ...any) sfMember {
	m := sfMember{Value: id}
	for i := 0; i+1 < len(params); i += 2 {
		v := params[i+1]
		if n, ok := v.(int); ok {
			v = int64(n)
		}
		m.Params = append(m.Params, sfParam{params[i].(string), v})
	}
	return m
}
