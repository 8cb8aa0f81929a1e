package redisstore_test

import (
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/redisstore"
)

// Ten requests per second per client address on /api/, shared by every
// instance of the application that uses the same Redis. It needs a
// running Redis, so this example is compiled but not run.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	store, err := redisstore.New(rdb, redisstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	perIP, err := httplimit.PerIP(store, sluice.Policy{ID: "api", Algorithm: sluice.GCRA, Limit: 10, Window: time.Second}, httplimit.Options{})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/api/", perIP.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}
