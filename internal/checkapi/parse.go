package checkapi

import (
	"unicode/utf8"
)

// ParseRequest reads b into in, which must be the zero Request, when b is
// one JSON object in the common shape: each key one of Request's, spelt
// as its tag, at most once; each string plain (no escape, valid UTF-8);
// cost a plain integer; refund and reset true or false; policies an array
// of such strings; whitespace anywhere JSON allows it. It reports false
// for anything else, and then in may hold part of b: the caller resets it
// and decodes b with encoding/json, which answers the rest (other
// spellings, escapes, null, errors). Where it reports true, in holds what
// encoding/json with DisallowUnknownFields decodes from b
// (TestParseRequestAgreesWithEncodingJSON): the server reads every check
// so, because encoding/json's reflection was a tenth of its CPU.
func ParseRequest(b []byte, in *Request) bool {
	p := parser{b: b}
	if !p.byte('{') {
		return false
	}
	var seen uint16
	if p.peek() == '}' {
		p.i++
		return p.end()
	}
	for {
		key, ok := p.str()
		if !ok || !p.byte(':') {
			return false
		}
		f := fieldOf(key)
		if f < 0 || seen&(1<<f) != 0 {
			return false
		}
		seen |= 1 << f
		if !p.value(f, in) {
			return false
		}
		switch p.next() {
		case ',':
		case '}':
			return p.end()
		default:
			return false
		}
	}
}

// The fields ParseRequest reads, by their JSON names.
const (
	fPolicy = iota
	fPolicies
	fSubject
	fCost
	fRefund
	fReset
	fEvaluationID
	fLeaseID
	fOp
	fPriority
	fMaxWaitMS
)

func fieldOf(key string) int {
	switch key {
	case "policy":
		return fPolicy
	case "policies":
		return fPolicies
	case "subject":
		return fSubject
	case "cost":
		return fCost
	case "refund":
		return fRefund
	case "reset":
		return fReset
	case "evaluation_id":
		return fEvaluationID
	case "lease_id":
		return fLeaseID
	case "op":
		return fOp
	case "priority":
		return fPriority
	case "max_wait_ms":
		return fMaxWaitMS
	}
	return -1
}

// parser reads b from i.
type parser struct {
	b []byte
	i int
}

// skip moves past JSON whitespace.
func (p *parser) skip() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// peek returns the next byte after whitespace, 0 at the end.
func (p *parser) peek() byte {
	p.skip()
	if p.i == len(p.b) {
		return 0
	}
	return p.b[p.i]
}

// next returns and consumes the next byte after whitespace, 0 at the end.
func (p *parser) next() byte {
	c := p.peek()
	if c != 0 {
		p.i++
	}
	return c
}

// byte consumes c, the next byte after whitespace.
func (p *parser) byte(c byte) bool { return p.next() == c }

// end reports whether only whitespace is left.
func (p *parser) end() bool {
	p.skip()
	return p.i == len(p.b)
}

// str reads a plain string: no escape, no control character, valid UTF-8.
func (p *parser) str() (string, bool) {
	if !p.byte('"') {
		return "", false
	}
	start, ascii := p.i, true
	for ; p.i < len(p.b); p.i++ {
		switch c := p.b[p.i]; {
		case c == '"':
			s := p.b[start:p.i]
			p.i++
			if !ascii && !utf8.Valid(s) {
				return "", false
			}
			return string(s), true
		case c == '\\' || c < 0x20:
			return "", false
		case c >= 0x80:
			ascii = false
		}
	}
	return "", false
}

// value reads field f's value into in.
func (p *parser) value(f int, in *Request) bool {
	var ok bool
	switch f {
	case fPolicy:
		in.Policy, ok = p.str()
	case fSubject:
		in.Subject, ok = p.str()
	case fEvaluationID:
		in.EvaluationID, ok = p.str()
	case fLeaseID:
		in.LeaseID, ok = p.str()
	case fOp:
		in.Op, ok = p.str()
	case fPriority:
		in.Priority, ok = p.str()
	case fRefund:
		in.Refund, ok = p.bool()
	case fReset:
		in.Reset, ok = p.bool()
	case fCost:
		var n int64
		if n, ok = p.int(); ok {
			in.Cost = &n
		}
	case fMaxWaitMS:
		var n int64
		if n, ok = p.int(); ok {
			in.MaxWaitMS = &n
		}
	case fPolicies:
		in.Policies, ok = p.strs()
	}
	return ok
}

// bool reads true or false.
func (p *parser) bool() (bool, bool) {
	p.skip()
	rest := p.b[p.i:]
	switch {
	case len(rest) >= 4 && string(rest[:4]) == "true":
		p.i += 4
		return true, p.delimited()
	case len(rest) >= 5 && string(rest[:5]) == "false":
		p.i += 5
		return false, p.delimited()
	}
	return false, false
}

// int reads a JSON integer that fits an int64: an optional minus, then 0
// or digits without a leading 0; no fraction, no exponent.
func (p *parser) int() (int64, bool) {
	p.skip()
	neg := p.i < len(p.b) && p.b[p.i] == '-'
	if neg {
		p.i++
	}
	start := p.i
	var n uint64
	for ; p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9'; p.i++ {
		if p.i-start >= 18 { // 19 digits may overflow: encoding/json decides
			return 0, false
		}
		n = n*10 + uint64(p.b[p.i]-'0')
	}
	digits := p.i - start
	if digits == 0 || (digits > 1 && p.b[start] == '0') || !p.delimited() {
		return 0, false
	}
	if neg {
		return -int64(n), true
	}
	return int64(n), true
}

// delimited reports whether the value just read ends there: the next
// byte after whitespace is a comma, a closing brace or bracket.
func (p *parser) delimited() bool {
	switch p.peek() {
	case ',', '}', ']':
		return true
	}
	return false
}

// strs reads an array of plain strings.
func (p *parser) strs() ([]string, bool) {
	if !p.byte('[') {
		return nil, false
	}
	out := []string{}
	if p.peek() == ']' {
		p.i++
		return out, true
	}
	for {
		s, ok := p.str()
		if !ok {
			return nil, false
		}
		out = append(out, s)
		switch p.next() {
		case ',':
		case ']':
			return out, true
		default:
			return nil, false
		}
	}
}
