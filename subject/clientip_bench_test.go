package subject

import "testing"

func BenchmarkClientIP(b *testing.B) {
	res, err := NewIPResolver(IPOptions{TrustedProxies: []string{"10.0.0.0/8"}})
	if err != nil {
		b.Fatal(err)
	}
	r := request("10.0.0.1:5555", xForwardedFor, "198.51.100.1, 203.0.113.7, 10.0.0.2")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := res.Prefix(r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkClientIPParallel(b *testing.B) {
	res, err := NewIPResolver(IPOptions{TrustedProxies: []string{"10.0.0.0/8"}, Header: forwarded})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := request("10.0.0.1:5555", forwarded, `for=198.51.100.1, for="[2001:db8::1]:4711";proto=https, for=10.0.0.2`)
		for pb.Next() {
			if _, err := res.Prefix(r); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
