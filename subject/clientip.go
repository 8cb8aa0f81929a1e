package subject

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// The forwarding headers an IPResolver can read.
const (
	// xForwardedFor is the de-facto standard list of hops:
	// "X-Forwarded-For: 203.0.113.7, 10.0.0.2".
	xForwardedFor = "X-Forwarded-For"
	// forwarded is RFC 7239's header:
	// `Forwarded: for=203.0.113.7, for="[2001:db8::1]:4711"`.
	forwarded = "Forwarded"
)

// Default address masks of an IPResolver, in bits.
const (
	defaultIPv4Prefix = 32
	defaultIPv6Prefix = 64
)

// trustedProxies is a set of network prefixes whose forwarding headers are
// believed. The nil *trustedProxies trusts no one. Immutable.
type trustedProxies struct {
	prefixes []netip.Prefix
}

// parseTrustedProxies parses CIDR prefixes ("10.0.0.0/8", "2001:db8::/32")
// or single addresses ("::1", taken as /32 or /128). A prefix with host
// bits set ("10.0.0.1/8") is an error, since it is usually a typo; the
// error names the entry.
func parseTrustedProxies(cidrs []string) (*trustedProxies, error) {
	if len(cidrs) == 0 {
		return nil, nil
	}
	t := &trustedProxies{prefixes: make([]netip.Prefix, 0, len(cidrs))}
	for i, s := range cidrs {
		p, err := parsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("subject: trusted proxy [%d] %q: %w", i, s, err)
		}
		t.prefixes = append(t.prefixes, p)
	}
	return t, nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, errors.New("not an address or CIDR prefix")
		}
		if a.Zone() != "" {
			return netip.Prefix{}, errors.New("zones are not allowed")
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, errors.New("not an address or CIDR prefix")
	}
	if p.Addr().Is4In6() && p.Bits() < 96 {
		return netip.Prefix{}, errors.New("an IPv4-mapped prefix must be at least /96")
	}
	if p != p.Masked() {
		return netip.Prefix{}, fmt.Errorf("host bits are set: did you mean %s?", p.Masked())
	}
	if a := p.Addr(); a.Is4In6() {
		// "::ffff:10.0.0.0/104" is 10.0.0.0/8: addresses are unmapped
		// before they are compared.
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p, nil
}

// contains reports whether a (unmapped) lies in one of t's prefixes.
func (t *trustedProxies) contains(a netip.Addr) bool {
	if t == nil {
		return false
	}
	a = a.Unmap().WithZone("")
	for _, p := range t.prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// IPOptions configure an IPResolver. The zero value trusts no proxy: the
// socket peer is the client.
type IPOptions struct {
	// TrustedProxies are the CIDR prefixes ("10.0.0.0/8", "2001:db8::/32")
	// or single addresses ("::1") of the proxies whose forwarding header
	// is believed. Only when the socket peer (http.Request.RemoteAddr) is
	// one of them is the header read at all. A prefix with host bits set
	// ("10.0.0.1/8") is an error, since it is usually a typo.
	// Default: none, no proxy is trusted.
	TrustedProxies []string
	// Header is the one forwarding header to read: "X-Forwarded-For" or
	// "Forwarded" (RFC 7239), whichever your proxies append to. Exactly
	// one is read, never both: a client can forge the header your proxies
	// do not touch, and no rule for combining the two would see through
	// that. Default: "X-Forwarded-For".
	Header string
	// IPv4Prefix is how many leading bits of an IPv4 address Prefix keeps,
	// 1 to 32. Default: 32.
	IPv4Prefix int
	// IPv6Prefix is how many leading bits of an IPv6 address Prefix keeps,
	// 1 to 128. The default /64 is what one host is usually given, so a
	// host cannot escape its budget by rotating addresses. Default: 64.
	IPv6Prefix int
}

// IPResolver finds the client address of an HTTP request behind trusted
// proxies. Its zero value trusts no proxy and masks to the default
// prefixes. Immutable and safe for concurrent use.
//
// The rule: when the socket peer is not a trusted proxy, it is the client
// and no header is read. Otherwise every line of the configured header is
// parsed, in order, as one list of hops, and the list is walked from the
// right (the hop nearest to us) to the left. The walk ends
//   - at the first address that is not a trusted proxy: that is the client;
//   - at a malformed entry, or a Forwarded "unknown" or obfuscated
//     ("_hidden") node, or an element without for=: the answer is the last
//     address reached, a trusted proxy (the peer, if the right-most entry
//     is already unusable). Nothing left of an unusable entry can be
//     vouched for, and that proxy is the nearest thing that can;
//   - at the left end with every hop trusted: the left-most hop.
//
// The answer is therefore always the peer or an address that appeared in
// the header. IPv4-mapped IPv6 addresses are unmapped and zones dropped.
// Empty list elements ("a, , b") are ignored, as RFC 9110 asks. Each line
// is parsed on its own, so an unterminated quote in one line cannot swallow
// the entries a proxy appended on the next.
type IPResolver struct {
	trusted    *trustedProxies
	forwarded  bool // the header is Forwarded, not X-Forwarded-For
	ipv4, ipv6 int  // 0: the default
}

// NewIPResolver validates opts and returns a resolver. The error names the
// option, its value and the rule it breaks.
func NewIPResolver(opts IPOptions) (*IPResolver, error) {
	trusted, err := parseTrustedProxies(opts.TrustedProxies)
	if err != nil {
		return nil, err
	}
	r := &IPResolver{trusted: trusted}
	switch h := http.CanonicalHeaderKey(opts.Header); h {
	case "", xForwardedFor:
	case forwarded:
		r.forwarded = true
	default:
		return nil, fmt.Errorf("subject: header %q: must be %s or %s", opts.Header, xForwardedFor, forwarded)
	}
	if opts.IPv4Prefix != 0 {
		if opts.IPv4Prefix < 1 || opts.IPv4Prefix > 32 {
			return nil, fmt.Errorf("subject: IPv4 prefix /%d: must be between 1 and 32", opts.IPv4Prefix)
		}
		r.ipv4 = opts.IPv4Prefix
	}
	if opts.IPv6Prefix != 0 {
		if opts.IPv6Prefix < 1 || opts.IPv6Prefix > 128 {
			return nil, fmt.Errorf("subject: IPv6 prefix /%d: must be between 1 and 128", opts.IPv6Prefix)
		}
		r.ipv6 = opts.IPv6Prefix
	}
	return r, nil
}

// Trusts reports whether a is one of the trusted proxies: whether a
// forwarding header a sent is believed. A proxy of your own that passes
// such headers on uses it to keep them only from trusted peers.
func (res *IPResolver) Trusts(a netip.Addr) bool { return res.trusted.contains(a) }

// Addr returns the client address of r, unmasked. The only error is a
// RemoteAddr that is not an address (as in "192.0.2.1:1234" or
// "[2001:db8::1]:80", or a bare address), e.g. on a Unix socket.
func (res *IPResolver) Addr(r *http.Request) (netip.Addr, error) {
	peer, err := parsePeer(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}, err
	}
	if !res.trusted.contains(peer) {
		return peer, nil
	}
	header := xForwardedFor
	if res.forwarded {
		header = forwarded
	}
	lines := r.Header.Values(header)
	if len(lines) == 0 {
		return peer, nil
	}
	var buf [16]hop
	hops := buf[:0]
	for _, line := range lines {
		if res.forwarded {
			hops = parseForwarded(line, hops)
		} else {
			hops = parseXForwardedFor(line, hops)
		}
	}
	return walk(peer, hops, res.trusted), nil
}

// Prefix returns the client address of r masked to the configured prefix
// length, e.g. 2001:db8:1:2::/64 or 203.0.113.7/32.
func (res *IPResolver) Prefix(r *http.Request) (netip.Prefix, error) {
	a, err := res.Addr(r)
	if err != nil {
		return netip.Prefix{}, err
	}
	return res.mask(a), nil
}

// mask returns a's prefix at the configured length.
func (res *IPResolver) mask(a netip.Addr) netip.Prefix {
	a = a.Unmap().WithZone("")
	bits := cmp.Or(res.ipv6, defaultIPv6Prefix)
	if a.Is4() {
		bits = cmp.Or(res.ipv4, defaultIPv4Prefix)
	}
	p, err := a.Prefix(bits)
	if err != nil { // the invalid Addr
		return netip.Prefix{}
	}
	return p
}

// hop is one list entry: an address, or an entry that ends the walk.
type hop struct {
	addr netip.Addr
	ok   bool
}

func walk(peer netip.Addr, hops []hop, trusted *trustedProxies) netip.Addr {
	cur := peer
	for i := len(hops) - 1; i >= 0; i-- {
		if !hops[i].ok {
			return cur
		}
		cur = hops[i].addr
		if !trusted.contains(cur) {
			return cur
		}
	}
	return cur
}

func parsePeer(s string) (netip.Addr, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), nil
	}
	return netip.Addr{}, fmt.Errorf("subject: remote address %q is not an IP address", s)
}

// parseXForwardedFor appends the hops of one X-Forwarded-For line to dst.
// An entry is an address, optionally with a port ("203.0.113.7:4711",
// "[2001:db8::1]:4711") as some proxies write.
func parseXForwardedFor(line string, dst []hop) []hop {
	for line != "" {
		var elem string
		if i := strings.IndexByte(line, ','); i >= 0 {
			elem, line = line[:i], line[i+1:]
		} else {
			elem, line = line, ""
		}
		elem = trimOWS(elem)
		if elem == "" {
			continue
		}
		a, ok := parseHostPort(elem, true)
		dst = append(dst, hop{a, ok})
	}
	return dst
}

// parseHostPort parses an address with an optional port. IPv6 with a port
// must be bracketed; bareIPv6 allows an unbracketed IPv6 address without
// port (X-Forwarded-For), which RFC 7239 forbids.
func parseHostPort(s string, bareIPv6 bool) (netip.Addr, bool) {
	if s == "" {
		return netip.Addr{}, false
	}
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		a, err := netip.ParseAddr(s[1:end])
		if err != nil || !a.Is6() {
			return netip.Addr{}, false
		}
		if rest := s[end+1:]; rest != "" && (rest[0] != ':' || !validPort(rest[1:])) {
			return netip.Addr{}, false
		}
		return a.Unmap().WithZone(""), true
	}
	host, port, hasPort := strings.Cut(s, ":")
	if hasPort && strings.Contains(port, ":") {
		// More than one colon: a bare IPv6 address.
		if !bareIPv6 {
			return netip.Addr{}, false
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Addr{}, false
		}
		return a.Unmap().WithZone(""), true
	}
	a, err := netip.ParseAddr(host)
	if err != nil || !a.Is4() {
		return netip.Addr{}, false
	}
	if hasPort && !validPort(port) {
		return netip.Addr{}, false
	}
	return a, true
}

// validPort accepts RFC 7239's node-port: 1 to 5 digits, or an obfuscated
// port "_" followed by ALPHA / DIGIT / "." / "_" / "-".
func validPort(s string) bool {
	if s == "" {
		return false
	}
	if s[0] == '_' {
		for i := 1; i < len(s); i++ {
			if c := s[i]; !isAlnum(c) && c != '.' && c != '_' && c != '-' {
				return false
			}
		}
		return len(s) > 1
	}
	if len(s) > 5 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// parseForwarded appends the hops of one RFC 7239 Forwarded line to dst:
//
//	Forwarded         = 1#forwarded-element
//	forwarded-element = [ forwarded-pair ] *( ";" [ forwarded-pair ] )
//	forwarded-pair    = token "=" value
//	value             = token / quoted-string
//
// Each element yields one hop from its for= parameter; an element without
// exactly one for=, with a syntax error, or naming an "unknown" or
// obfuscated node yields a hop that ends the walk.
func parseForwarded(line string, dst []hop) []hop {
	i := 0
	for i <= len(line) {
		var (
			node string
			nFor int
			bad  bool
			seen bool
		)
	pairs:
		for {
			i = skipOWS(line, i)
			if i == len(line) || line[i] == ',' {
				break
			}
			if line[i] == ';' { // an empty pair
				i++
				continue
			}
			seen = true
			j := i
			for j < len(line) && isTchar(line[j]) {
				j++
			}
			name := line[i:j]
			if name == "" || j == len(line) || line[j] != '=' {
				bad = true
				break
			}
			i = j + 1
			var value string
			var ok bool
			if value, i, ok = parseValue(line, i); !ok {
				bad = true
				break
			}
			if strings.EqualFold(name, "for") {
				node, nFor = value, nFor+1
			}
			i = skipOWS(line, i)
			switch {
			case i == len(line) || line[i] == ',':
				break pairs
			case line[i] == ';':
				i++
			default:
				bad = true
				break pairs
			}
		}
		if bad {
			dst = append(dst, hop{})
			i = skipElement(line, i)
		} else if seen {
			if nFor != 1 {
				dst = append(dst, hop{})
			} else {
				a, ok := parseNode(node)
				dst = append(dst, hop{a, ok})
			}
		}
		i++ // past the ',' (or the end)
	}
	return dst
}

// parseValue reads a token or a quoted-string at line[i:], returning the
// (unescaped) value and the index after it.
func parseValue(line string, i int) (string, int, bool) {
	if i < len(line) && line[i] == '"' {
		var b strings.Builder
		for i++; i < len(line); i++ {
			switch c := line[i]; {
			case c == '"':
				return b.String(), i + 1, true
			case c == '\\':
				i++
				if i == len(line) || !isQuotedPairChar(line[i]) {
					return "", len(line), false
				}
				b.WriteByte(line[i])
			case isQdtext(c):
				b.WriteByte(c)
			default:
				return "", i, false
			}
		}
		return "", len(line), false // unterminated
	}
	j := i
	for j < len(line) && isTchar(line[j]) {
		j++
	}
	if j == i {
		return "", i, false
	}
	return line[i:j], j, true
}

// skipElement moves past the rest of a malformed element to its ',' (or
// the end), stepping over quoted strings; an unterminated quote runs to
// the end of the line.
func skipElement(line string, i int) int {
	for i < len(line) {
		switch line[i] {
		case ',':
			return i
		case '"':
			for i++; i < len(line) && line[i] != '"'; i++ {
				if line[i] == '\\' {
					i++
				}
			}
			if i >= len(line) {
				return len(line)
			}
		}
		i++
	}
	return len(line)
}

// parseNode parses RFC 7239's node: an IPv4 address or a bracketed IPv6
// address, each with an optional port. "unknown" and obfuscated
// identifiers ("_hidden") are not addresses.
func parseNode(s string) (netip.Addr, bool) {
	if s == "" || s[0] == '_' || strings.EqualFold(s, "unknown") {
		return netip.Addr{}, false
	}
	return parseHostPort(s, false)
}

func skipOWS(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	return i
}

func trimOWS(s string) string { return strings.Trim(s, " \t") }

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// isTchar reports whether c is an RFC 9110 token character.
func isTchar(c byte) bool {
	return isAlnum(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func isQdtext(c byte) bool {
	return c == '\t' || c == ' ' || c == 0x21 || 0x23 <= c && c <= 0x5b || 0x5d <= c && c <= 0x7e || c >= 0x80
}

func isQuotedPairChar(c byte) bool { return c == '\t' || 0x20 <= c && c <= 0x7e || c >= 0x80 }
