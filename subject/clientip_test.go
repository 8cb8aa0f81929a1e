package subject

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

func mustTrusted(t testing.TB, cidrs ...string) *trustedProxies {
	t.Helper()
	tp, err := parseTrustedProxies(cidrs)
	if err != nil {
		t.Fatal(err)
	}
	return tp
}

// clientIP is the unmasked X-Forwarded-For address of r behind trusted.
func clientIP(r *http.Request, trusted *trustedProxies) (netip.Addr, error) {
	res := IPResolver{trusted: trusted}
	return res.Addr(r)
}

func request(remote, header string, lines ...string) *http.Request {
	r := &http.Request{RemoteAddr: remote, Header: http.Header{}}
	for _, l := range lines {
		r.Header.Add(header, l)
	}
	return r
}

func TestClientIPXForwardedFor(t *testing.T) {
	trusted := mustTrusted(t, "10.0.0.0/8", "2001:db8:ffff::/48")
	tests := []struct {
		name   string
		remote string
		lines  []string
		want   string
	}{
		{"no header", "192.0.2.1:1234", nil, "192.0.2.1"},
		{"untrusted peer ignores header", "192.0.2.1:1234", []string{"203.0.113.7"}, "192.0.2.1"},
		{"untrusted peer ignores spoofed chain", "192.0.2.1:1234", []string{"10.0.0.9, 203.0.113.7, 10.0.0.1"}, "192.0.2.1"},
		{"trusted peer, no header", "10.0.0.1:1234", nil, "10.0.0.1"},
		{"trusted peer, one hop", "10.0.0.1:1234", []string{"203.0.113.7"}, "203.0.113.7"},
		{"right-most untrusted wins over spoofed left", "10.0.0.1:1234", []string{"198.51.100.66, 203.0.113.7"}, "203.0.113.7"},
		{"trusted hops are skipped", "10.0.0.1:1234", []string{"198.51.100.66, 203.0.113.7, 10.0.0.2, 10.1.2.3"}, "203.0.113.7"},
		{"lines are joined in order", "10.0.0.1:1234", []string{"198.51.100.66", "203.0.113.7, 10.0.0.2"}, "203.0.113.7"},
		{"all hops trusted: left-most", "10.0.0.1:1234", []string{"10.0.0.3, 10.0.0.2"}, "10.0.0.3"},
		{"malformed right-most: the peer", "10.0.0.1:1234", []string{"203.0.113.7, garbage"}, "10.0.0.1"},
		{"malformed behind a trusted hop: that hop", "10.0.0.1:1234", []string{"203.0.113.7, bogus, 10.0.0.2"}, "10.0.0.2"},
		{"malformed left of the client is never reached", "10.0.0.1:1234", []string{"bogus, 203.0.113.7"}, "203.0.113.7"},
		{"empty elements are ignored", "10.0.0.1:1234", []string{" , 203.0.113.7 ,, "}, "203.0.113.7"},
		{"ports are tolerated", "10.0.0.1:1234", []string{"203.0.113.7:4711"}, "203.0.113.7"},
		{"bracketed IPv6 with port", "10.0.0.1:1234", []string{"[2001:db8::1]:4711"}, "2001:db8::1"},
		{"bare IPv6", "10.0.0.1:1234", []string{"2001:db8::1"}, "2001:db8::1"},
		{"IPv4-mapped is unmapped", "10.0.0.1:1234", []string{"::ffff:203.0.113.7"}, "203.0.113.7"},
		{"mapped trusted hop is trusted", "10.0.0.1:1234", []string{"203.0.113.7, ::ffff:10.0.0.2"}, "203.0.113.7"},
		{"mapped peer", "[::ffff:10.0.0.1]:1234", []string{"203.0.113.7"}, "203.0.113.7"},
		{"IPv6 trusted peer", "[2001:db8:ffff::1]:443", []string{"2001:db8:1::5"}, "2001:db8:1::5"},
		{"zone dropped", "10.0.0.1:1234", []string{"fe80::1%eth0"}, "fe80::1"},
		{"bare remote address", "10.0.0.1", []string{"203.0.113.7"}, "203.0.113.7"},
		{"unknown is malformed in XFF", "10.0.0.1:1234", []string{"unknown"}, "10.0.0.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := request(tt.remote, "X-Forwarded-For", tt.lines...)
			got, err := clientIP(r, trusted)
			if err != nil {
				t.Fatalf("ClientIP(%q, %q) error: %v", tt.remote, tt.lines, err)
			}
			if got != netip.MustParseAddr(tt.want) {
				t.Errorf("ClientIP(%q, %q) = %v, want %v", tt.remote, tt.lines, got, tt.want)
			}
		})
	}
}

func TestClientIPForwarded(t *testing.T) {
	res, err := NewIPResolver(IPOptions{TrustedProxies: []string{"10.0.0.0/8"}, Header: "forwarded"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		lines []string
		want  string
	}{
		{"token", []string{"for=203.0.113.7"}, "203.0.113.7"},
		{"case-insensitive name, other pairs", []string{"proto=https;For=203.0.113.7;by=10.0.0.1"}, "203.0.113.7"},
		{"quoted IPv6 with port", []string{`for="[2001:db8::1]:4711"`}, "2001:db8::1"},
		{"quoted IPv4 with port", []string{`for="203.0.113.7:4711"`}, "203.0.113.7"},
		{"quoted with escapes", []string{`for="203.0.113.\7"`}, "203.0.113.7"},
		{"obfuscated port", []string{`for="203.0.113.7:_abc"`}, "203.0.113.7"},
		{"right-most untrusted", []string{"for=198.51.100.66, for=203.0.113.7;proto=http, for=10.0.0.2"}, "203.0.113.7"},
		{"lines joined", []string{"for=198.51.100.66", "for=203.0.113.7", "for=10.0.0.2"}, "203.0.113.7"},
		{"comma in quoted string", []string{`for=198.51.100.66;x="a,b", for=203.0.113.7`}, "203.0.113.7"},
		{"unknown stops at the peer", []string{"for=198.51.100.66, for=unknown"}, "10.0.0.1"},
		{"obfuscated stops at last trusted", []string{"for=198.51.100.66, for=_hidden, for=10.0.0.2"}, "10.0.0.2"},
		{"element without for", []string{"for=198.51.100.66, proto=https"}, "10.0.0.1"},
		{"two for in one element", []string{"for=198.51.100.66;for=203.0.113.7"}, "10.0.0.1"},
		{"unquoted IPv6 is invalid", []string{"for=2001:db8::1"}, "10.0.0.1"},
		{"quoted unbracketed IPv6 is invalid", []string{`for="2001:db8::1"`}, "10.0.0.1"},
		{"unquoted port is invalid", []string{"for=203.0.113.7:80"}, "10.0.0.1"},
		{"unterminated quote only spoils its line", []string{`for="198.51.100.66`, "for=203.0.113.7"}, "203.0.113.7"},
		{"unterminated quote on the same line", []string{`for="198.51.100.66, for=203.0.113.7`}, "10.0.0.1"},
		{"malformed left of the client is ignored", []string{`for==;;x, for=203.0.113.7`}, "203.0.113.7"},
		{"empty elements ignored", []string{" , for=203.0.113.7 , "}, "203.0.113.7"},
		{"all trusted: left-most", []string{"for=10.0.0.3, for=10.0.0.2"}, "10.0.0.3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := request("10.0.0.1:1234", "Forwarded", tt.lines...)
			r.Header.Set("X-Forwarded-For", "192.0.2.99") // never read: Forwarded is configured
			got, err := res.Addr(r)
			if err != nil {
				t.Fatalf("Addr(%q) error: %v", tt.lines, err)
			}
			if got != netip.MustParseAddr(tt.want) {
				t.Errorf("Addr(%q) = %v, want %v", tt.lines, got, tt.want)
			}
		})
	}
}

func TestIPResolverReadsOnlyTheConfiguredHeader(t *testing.T) {
	res, err := NewIPResolver(IPOptions{TrustedProxies: []string{"10.0.0.0/8"}})
	if err != nil {
		t.Fatal(err)
	}
	r := request("10.0.0.1:1", "Forwarded", "for=198.51.100.1")
	if got, _ := res.Addr(r); got != netip.MustParseAddr("10.0.0.1") {
		t.Errorf("Addr with only Forwarded, XFF configured = %v, want the peer 10.0.0.1", got)
	}
}

func TestPrefix(t *testing.T) {
	tests := []struct {
		name       string
		opts       IPOptions
		remote     string
		xff        string
		want       string
		wantString string
	}{
		{"IPv4 default /32", IPOptions{}, "203.0.113.7:1", "", "203.0.113.7/32", "203.0.113.7/32"},
		{"IPv6 default /64", IPOptions{}, "[2001:db8:1:2:3:4:5:6]:1", "", "2001:db8:1:2::/64", "2001:db8:1:2::/64"},
		{"IPv6 /48", IPOptions{IPv6Prefix: 48}, "[2001:db8:1:2:3:4:5:6]:1", "", "2001:db8:1::/48", "2001:db8:1::/48"},
		{"IPv4 /24", IPOptions{IPv4Prefix: 24}, "203.0.113.7:1", "", "203.0.113.0/24", "203.0.113.0/24"},
		{"mapped is masked as IPv4", IPOptions{TrustedProxies: []string{"10.0.0.0/8"}}, "10.0.0.1:1", "::ffff:203.0.113.7", "203.0.113.7/32", "203.0.113.7/32"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := NewIPResolver(tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			r := request(tt.remote, "X-Forwarded-For")
			if tt.xff != "" {
				r.Header.Set("X-Forwarded-For", tt.xff)
			}
			got, err := res.Prefix(r)
			if err != nil {
				t.Fatal(err)
			}
			if got != netip.MustParsePrefix(tt.want) || got.String() != tt.wantString {
				t.Errorf("Prefix(%q) = %v, want %v", tt.remote, got, tt.want)
			}
		})
	}
}

func TestAddrBadRemote(t *testing.T) {
	for _, remote := range []string{"", "@", "/tmp/sock", "example.com:80"} {
		if a, err := clientIP(request(remote, "X-Forwarded-For", "203.0.113.7"), nil); err == nil {
			t.Errorf("ClientIP(RemoteAddr %q) = %v, want an error", remote, a)
		}
	}
}

func TestParseTrustedProxies(t *testing.T) {
	tp, err := parseTrustedProxies([]string{"10.0.0.0/8", " ::1 ", "192.0.2.1", "::ffff:172.16.0.0/108", "2001:db8::/32"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range tp.prefixes {
		got = append(got, p.String())
	}
	if got, want := strings.Join(got, ","), "10.0.0.0/8,::1/128,192.0.2.1/32,172.16.0.0/12,2001:db8::/32"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	for addr, want := range map[string]bool{
		"10.1.2.3": true, "::ffff:10.1.2.3": true, "::1": true, "192.0.2.1": true, "192.0.2.2": false,
		"172.31.255.255": true, "172.32.0.0": false, "2001:db8:5::1": true, "2001:db9::1": false,
	} {
		if got := tp.contains(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Contains(%s) = %v, want %v", addr, got, want)
		}
	}
	var none *trustedProxies
	if none.contains(netip.MustParseAddr("127.0.0.1")) {
		t.Error("nil trustedProxies contains 127.0.0.1, want nothing")
	}

	for _, tt := range []struct{ in, wantErr string }{
		{"10.0.0.0/33", `[1] "10.0.0.0/33"`},
		{"10.0.0.1/8", "host bits are set: did you mean 10.0.0.0/8?"},
		{"localhost", `[1] "localhost": not an address`},
		{"", `[1] ""`},
		{"fe80::1%eth0", "zones are not allowed"},
		{"::ffff:0:0/64", "at least /96"},
	} {
		_, err := parseTrustedProxies([]string{"10.0.0.0/8", tt.in})
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("parseTrustedProxies(%q) error = %v, want one containing %q", tt.in, err, tt.wantErr)
		}
	}
}

func TestNewIPResolverErrors(t *testing.T) {
	for _, opts := range []IPOptions{
		{Header: "X-Real-IP"},
		{IPv4Prefix: 33},
		{IPv4Prefix: -1},
		{IPv6Prefix: 129},
		{TrustedProxies: []string{"10.0.0.1/8"}},
	} {
		if _, err := NewIPResolver(opts); err == nil {
			t.Errorf("NewIPResolver(%+v) = nil error, want one", opts)
		}
	}
}

// TestTrustsAndZeroResolver: Trusts answers for the configured proxies
// only, and the zero IPResolver trusts no one and masks to the defaults.
func TestTrustsAndZeroResolver(t *testing.T) {
	res, err := NewIPResolver(IPOptions{TrustedProxies: []string{"10.0.0.0/8"}})
	if err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]bool{"10.9.8.7": true, "::ffff:10.0.0.1": true, "192.0.2.1": false} {
		if got := res.Trusts(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Trusts(%s) = %v, want %v", addr, got, want)
		}
	}
	var zero IPResolver
	if zero.Trusts(netip.MustParseAddr("10.0.0.1")) {
		t.Error("zero IPResolver trusts 10.0.0.1, want no one")
	}
	r := request("10.0.0.1:1", "X-Forwarded-For", "203.0.113.7")
	if got, err := zero.Prefix(r); err != nil || got.String() != "10.0.0.1/32" {
		t.Errorf("zero IPResolver Prefix = %v, %v; want the peer 10.0.0.1/32", got, err)
	}
	r.RemoteAddr = "[2001:db8:1:2::9]:1"
	if got, err := zero.Prefix(r); err != nil || got.String() != "2001:db8:1:2::/64" {
		t.Errorf("zero IPResolver Prefix = %v, %v; want 2001:db8:1:2::/64", got, err)
	}
}

// checkFromHeader asserts the fuzz invariant: got is the peer or an
// address written somewhere in the header lines.
func checkFromHeader(t *testing.T, got, peer netip.Addr, lines []string) {
	t.Helper()
	if got == peer {
		return
	}
	for _, line := range lines {
		line = strings.ReplaceAll(line, `\`, "") // quoted-pair escapes
		for i := 0; i < len(line); i++ {
			for j := i + 1; j <= len(line) && j-i <= 64; j++ {
				a, err := netip.ParseAddr(line[i:j])
				if err == nil && a.Unmap().WithZone("") == got {
					return
				}
			}
		}
	}
	t.Fatalf("resolved %v from peer %v and header %q: neither the peer nor in the header", got, peer, lines)
}

func fuzzResolve(t *testing.T, header, line1, line2 string) {
	if len(line1)+len(line2) > 1024 {
		return
	}
	res, err := NewIPResolver(IPOptions{TrustedProxies: []string{"10.0.0.0/8", "2001:db8::/32", "127.0.0.1"}, Header: header})
	if err != nil {
		t.Fatal(err)
	}
	peer := netip.MustParseAddr("10.0.0.1")
	lines := []string{line1, line2}
	r := request("10.0.0.1:8080", header, lines...)
	got, err := res.Addr(r)
	if err != nil {
		t.Fatalf("Addr(%q) error: %v", lines, err)
	}
	if !got.IsValid() || got.Zone() != "" || got.Is4In6() {
		t.Fatalf("Addr(%q) = %v: not a valid, unmapped, zone-less address", lines, got)
	}
	checkFromHeader(t, got, peer, lines)
	if p, err := res.Prefix(r); err != nil || !p.IsValid() || !p.Contains(got) {
		t.Fatalf("Prefix(%q) = %v, %v: want a valid prefix containing %v", lines, p, err, got)
	}
	// An untrusted peer is always the answer.
	r.RemoteAddr = "192.0.2.1:80"
	if got, _ := res.Addr(r); got != netip.MustParseAddr("192.0.2.1") {
		t.Fatalf("Addr(%q) from untrusted peer = %v, want the peer", lines, got)
	}
}

func FuzzXForwardedFor(f *testing.F) {
	for _, s := range []string{
		"203.0.113.7", "198.51.100.66, 203.0.113.7, 10.0.0.2", "[2001:db8::1]:4711", "::ffff:10.0.0.2",
		"fe80::1%eth0, 10.0.0.3", " , ,, ", "unknown", "1.2.3.4:99999", "[::1", "10.0.0.5, garbage, 10.0.0.2",
	} {
		f.Add(s, "10.0.0.9")
		f.Add("", s)
	}
	f.Fuzz(func(t *testing.T, line1, line2 string) { fuzzResolve(t, xForwardedFor, line1, line2) })
}

func FuzzForwarded(f *testing.F) {
	for _, s := range []string{
		"for=203.0.113.7", `for="[2001:db8::1]:4711";proto=https`, "for=unknown, for=10.0.0.2", `for=_hidden`,
		`for="203.0.113.\7:_x", for=10.0.0.2`, `for="unterminated, for=10.0.0.2`, ";;,;,", `a=b;for=1.2.3.4;by="[::1]"`,
		`For="::ffff:10.0.0.2"`, `for="[fe80::1%25eth0]"`,
	} {
		f.Add(s, "for=10.0.0.9")
		f.Add("", s)
	}
	f.Fuzz(func(t *testing.T, line1, line2 string) { fuzzResolve(t, forwarded, line1, line2) })
}
