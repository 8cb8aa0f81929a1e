// Package sfparse parses Structured Field Lists (RFC 9651, section 4.2)
// strictly, the way a client reads them. It exists so the tests of every
// package that writes RateLimit-Policy and RateLimit fields check the
// bytes against the grammar with one parser, independent of the
// serializer under test.
//
// Every bare item type of RFC 9651 is parsed: Integer (int64), Decimal
// (Decimal), String (string), Token (Token), Byte Sequence ([]byte),
// Boolean (bool), Date (Date) and Display String (DisplayString); list
// members may be Inner Lists (InnerList).
package sfparse

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Token is a Token bare item, e.g. foo or */*.
type Token string

// Decimal is a Decimal bare item in thousandths: 1.5 is Decimal(1500).
// RFC 9651 allows at most three fractional digits, so this is exact.
type Decimal int64

// Date is a Date bare item: seconds since the Unix epoch.
type Date int64

// DisplayString is a Display String bare item, decoded to UTF-8.
type DisplayString string

// Param is one parameter of an item or inner list. A parameter without
// a value has Value true.
type Param struct {
	Key   string
	Value any
}

// Item is a bare item with its parameters. Value is one of int64,
// Decimal, string, Token, []byte, bool, Date, DisplayString.
type Item struct {
	Value  any
	Params []Param
}

// InnerList is a parenthesized list of items with its own parameters.
type InnerList struct {
	Items  []Item
	Params []Param
}

// Member is one member of a List: Value is a bare item (as in Item) or
// an InnerList.
type Member struct {
	Value  any
	Params []Param
}

// Param returns the value of the parameter key of m and whether it is
// there.
func (m Member) Param(key string) (any, bool) {
	for _, p := range m.Params {
		if p.Key == key {
			return p.Value, true
		}
	}
	return nil, false
}

// ParseFieldLines parses the field lines of one List field, combined as
// RFC 9651 section 4.2 says (joined with ", "). No lines, or only empty
// ones, give an empty list: RFC 9651 makes that the same as an absent
// field.
func ParseFieldLines(lines []string) ([]Member, error) {
	return ParseList(strings.Join(lines, ", "))
}

// ParseList parses s as the value of a List field.
func ParseList(s string) ([]Member, error) {
	for _, c := range []byte(s) {
		if c > 0x7e {
			return nil, fmt.Errorf("sfparse: byte %#x: a field value is ASCII", c)
		}
	}
	p := &parser{s: s}
	p.skipSP()
	var out []Member
	for p.i < len(p.s) {
		m, err := p.member()
		if err != nil {
			return nil, err
		}
		out = append(out, m)
		p.skipOWS()
		if p.i == len(p.s) {
			return out, nil
		}
		if p.s[p.i] != ',' {
			return nil, p.errorf("want ',' after a list member, got %q", p.s[p.i])
		}
		p.i++
		p.skipOWS()
		if p.i == len(p.s) {
			return nil, p.errorf("trailing comma")
		}
	}
	return out, nil
}

type parser struct {
	s string
	i int
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("sfparse: at %d: %s", p.i, fmt.Sprintf(format, args...))
}

func (p *parser) skipSP() {
	for p.i < len(p.s) && p.s[p.i] == ' ' {
		p.i++
	}
}

func (p *parser) skipOWS() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *parser) member() (Member, error) {
	if p.i < len(p.s) && p.s[p.i] == '(' {
		il, err := p.innerList()
		return Member{Value: il, Params: il.Params}, err
	}
	it, err := p.item()
	return Member(it), err
}

// innerList parses RFC 9651 section 4.2.1.2.
func (p *parser) innerList() (InnerList, error) {
	p.i++ // '('
	var il InnerList
	for p.i < len(p.s) {
		p.skipSP()
		if p.i < len(p.s) && p.s[p.i] == ')' {
			p.i++
			params, err := p.params()
			if err != nil {
				return InnerList{}, err
			}
			il.Params = params
			return il, nil
		}
		it, err := p.item()
		if err != nil {
			return InnerList{}, err
		}
		il.Items = append(il.Items, it)
		if p.i < len(p.s) && p.s[p.i] != ' ' && p.s[p.i] != ')' {
			return InnerList{}, p.errorf("want ' ' or ')' in an inner list, got %q", p.s[p.i])
		}
	}
	return InnerList{}, p.errorf("unterminated inner list")
}

// item parses RFC 9651 section 4.2.3.
func (p *parser) item() (Item, error) {
	v, err := p.bare()
	if err != nil {
		return Item{}, err
	}
	params, err := p.params()
	return Item{Value: v, Params: params}, err
}

// params parses RFC 9651 section 4.2.3.2: a repeated key replaces the
// earlier value in place.
func (p *parser) params() ([]Param, error) {
	var out []Param
	for p.i < len(p.s) && p.s[p.i] == ';' {
		p.i++
		p.skipSP()
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		var val any = true
		if p.i < len(p.s) && p.s[p.i] == '=' {
			p.i++
			if val, err = p.bare(); err != nil {
				return nil, err
			}
		}
		replaced := false
		for j := range out {
			if out[j].Key == key {
				out[j].Value, replaced = val, true
			}
		}
		if !replaced {
			out = append(out, Param{key, val})
		}
	}
	return out, nil
}

// key parses RFC 9651 section 4.2.3.3.
func (p *parser) key() (string, error) {
	start := p.i
	if p.i == len(p.s) || !(isLCAlpha(p.s[p.i]) || p.s[p.i] == '*') {
		return "", p.errorf("a key starts with a-z or '*'")
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

// bare parses RFC 9651 section 4.2.3.1.
func (p *parser) bare() (any, error) {
	if p.i == len(p.s) {
		return nil, p.errorf("want a bare item, got the end")
	}
	switch c := p.s[p.i]; {
	case c == '-' || isDigit(c):
		return p.number()
	case c == '"':
		return p.str()
	case c == '*' || isAlpha(c):
		return p.token(), nil
	case c == ':':
		return p.bytes()
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return p.s[p.i-1] == '1', nil
		}
		return nil, p.errorf("a boolean is ?0 or ?1")
	case c == '@':
		p.i++
		n, err := p.number()
		if err != nil {
			return nil, err
		}
		if d, ok := n.(int64); ok {
			return Date(d), nil
		}
		return nil, p.errorf("a date is an integer")
	case c == '%':
		return p.displayString()
	default:
		return nil, p.errorf("unexpected %q", c)
	}
}

// number parses RFC 9651 section 4.2.4: an int64 or a Decimal.
func (p *parser) number() (any, error) {
	start := p.i
	neg := false
	if p.s[p.i] == '-' {
		neg = true
		p.i++
	}
	if p.i == len(p.s) || !isDigit(p.s[p.i]) {
		return nil, p.errorf("a number needs a digit")
	}
	digits := p.i
	for p.i < len(p.s) && isDigit(p.s[p.i]) {
		p.i++
	}
	intDigits := p.i - digits
	if p.i == len(p.s) || p.s[p.i] != '.' {
		if intDigits > 15 {
			return nil, fmt.Errorf("sfparse: at %d: an integer has at most 15 digits", start)
		}
		return strconv.ParseInt(p.s[start:p.i], 10, 64)
	}
	if intDigits > 12 {
		return nil, fmt.Errorf("sfparse: at %d: a decimal has at most 12 integer digits", start)
	}
	p.i++ // '.'
	frac := p.i
	for p.i < len(p.s) && isDigit(p.s[p.i]) {
		p.i++
	}
	n := p.i - frac
	if n == 0 || n > 3 {
		return nil, fmt.Errorf("sfparse: at %d: a decimal has 1 to 3 fractional digits", start)
	}
	whole, _ := strconv.ParseInt(p.s[digits:frac-1], 10, 64)
	part, _ := strconv.ParseInt(p.s[frac:p.i]+strings.Repeat("0", 3-n), 10, 64)
	d := whole*1000 + part
	if neg {
		d = -d
	}
	return Decimal(d), nil
}

// str parses RFC 9651 section 4.2.5.
func (p *parser) str() (string, error) {
	p.i++ // '"'
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.i == len(p.s) || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
				return "", p.errorf(`only \" and \\ are escapes`)
			}
			b.WriteByte(p.s[p.i])
			p.i++
		case c == '"':
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("sfparse: at %d: byte %#x in a string", p.i-1, c)
		default:
			b.WriteByte(c)
		}
	}
	return "", p.errorf("unterminated string")
}

// token parses RFC 9651 section 4.2.6.
func (p *parser) token() Token {
	start := p.i
	p.i++
	for p.i < len(p.s) && (isTchar(p.s[p.i]) || p.s[p.i] == ':' || p.s[p.i] == '/') {
		p.i++
	}
	return Token(p.s[start:p.i])
}

// bytes parses RFC 9651 section 4.2.7.
func (p *parser) bytes() ([]byte, error) {
	p.i++ // ':'
	start := p.i
	for p.i < len(p.s) && p.s[p.i] != ':' {
		c := p.s[p.i]
		if !(isAlpha(c) || isDigit(c) || c == '+' || c == '/' || c == '=') {
			return nil, p.errorf("byte %q in a byte sequence", c)
		}
		p.i++
	}
	if p.i == len(p.s) {
		return nil, p.errorf("unterminated byte sequence")
	}
	enc := p.s[start:p.i]
	p.i++
	b, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		// RFC 9651 lets parsers accept a sequence without its padding.
		var err2 error
		if b, err2 = base64.RawStdEncoding.DecodeString(enc); err2 != nil {
			return nil, fmt.Errorf("sfparse: byte sequence %q: %w", enc, err)
		}
	}
	if b == nil {
		b = []byte{}
	}
	return b, nil
}

// displayString parses RFC 9651 section 4.2.10.
func (p *parser) displayString() (DisplayString, error) {
	if p.i+1 >= len(p.s) || p.s[p.i+1] != '"' {
		return "", p.errorf(`a display string starts with %%"`)
	}
	p.i += 2
	var b []byte
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '%':
			if p.i+2 > len(p.s) || !isLCHex(p.s[p.i]) || !isLCHex(p.s[p.i+1]) {
				return "", p.errorf("a %% in a display string is followed by two lowercase hex digits")
			}
			n, _ := strconv.ParseUint(p.s[p.i:p.i+2], 16, 8)
			b = append(b, byte(n))
			p.i += 2
		case c == '"':
			if !utf8.Valid(b) {
				return "", errors.New("sfparse: a display string is not valid UTF-8")
			}
			return DisplayString(b), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("sfparse: at %d: byte %#x in a display string", p.i-1, c)
		default:
			b = append(b, c)
		}
	}
	return "", p.errorf("unterminated display string")
}

func isLCAlpha(c byte) bool { return 'a' <= c && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || 'A' <= c && c <= 'Z' }
func isDigit(c byte) bool   { return '0' <= c && c <= '9' }
func isLCHex(c byte) bool   { return isDigit(c) || 'a' <= c && c <= 'f' }

// isTchar reports an RFC 9110 tchar.
func isTchar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
