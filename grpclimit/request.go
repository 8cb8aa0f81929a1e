package grpclimit

import (
	"context"
	"net/http"
	"net/url"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// request is the call whose context is ctx, of the full method name
// method, as the HTTP/2 request it is, for a subject.KeyFunc: the
// incoming metadata as Header (keys in canonical form: "x-api-key" is
// "X-Api-Key"; pseudo-headers such as ":authority" left out), the peer's
// address as RemoteAddr ("" when it has none, as on a Unix socket, whose
// address is no IP), the method as URL.Path and ctx as Context, where a
// Principal reads what authentication put (grpc.Method, peer.FromContext
// work on r.Context() as on ctx).
func request(ctx context.Context, method string) *http.Request {
	r := &http.Request{
		Method:     http.MethodPost,
		URL:        &url.URL{Path: method},
		RequestURI: method,
		Proto:      "HTTP/2.0",
		ProtoMajor: 2,
		Header:     http.Header{},
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		r.RemoteAddr = p.Addr.String()
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for k, v := range md {
		if strings.HasPrefix(k, ":") {
			if k == ":authority" && len(v) > 0 {
				r.Host = v[0]
			}
			continue
		}
		r.Header[http.CanonicalHeaderKey(k)] = v
	}
	return r.WithContext(ctx)
}
