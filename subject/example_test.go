package subject_test

import (
	"fmt"
	"log"
	"net/http/httptest"

	"github.com/sluicehq/sluice/subject"
)

// A keyed pseudonymizer: the same caller on the same operation always
// gets the same subject; on another operation, another one. The secret
// comes from a secret store in production, never from the code.
func ExamplePseudonymizer() {
	p, err := subject.New([]subject.Key{{ID: "k1", Secret: []byte("0123456789abcdef0123456789abcdef")}})
	if err != nil {
		log.Fatal(err)
	}
	login := p.Pseudonym("principal", "alice@example.com", "POST /login")
	fmt.Println(login)
	fmt.Println(login == p.Pseudonym("principal", "alice@example.com", "POST /login"))
	fmt.Println(login == p.Pseudonym("principal", "alice@example.com", "* /api"))
	// Output:
	// k1:5tUjSdTaeH9mwNL2m5ewEw
	// true
	// false
}

// Behind a load balancer at 10.0.0.0/8 the client is the right-most
// X-Forwarded-For entry that is not a trusted proxy; what the client
// itself wrote further left is not believed.
func ExampleIPResolver() {
	res, err := subject.NewIPResolver(subject.IPOptions{TrustedProxies: []string{"10.0.0.0/8"}})
	if err != nil {
		log.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.0.0.5:40312" // the load balancer
	r.Header.Set("X-Forwarded-For", "198.51.100.1, 203.0.113.7")
	addr, err := res.Addr(r)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(addr)

	r.RemoteAddr = "[2001:db8:1:2::77]:40312" // a client reaching us directly
	prefix, _ := res.Prefix(r)
	fmt.Println(prefix)
	// Output:
	// 203.0.113.7
	// 2001:db8:1:2::/64
}
