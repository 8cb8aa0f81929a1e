package envoyrlqs

import (
	"fmt"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Redirect points the Proxy at the RLQS server at addr from its next
// stream on, as an Envoy reconnects through its cluster to another
// endpoint when the server it reached went away: the bucket cache, the
// assignments in force and the timers stay; a stream still open is cut
// (its end recorded, as Cut), and the next report (the periodic one, or
// a new bucket's) opens a stream to addr.
func (p *Proxy) Redirect(addr string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("envoyrlqs: redirect to %s: %w", addr, err)
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = conn.Close()
		return fmt.Errorf("envoyrlqs: redirect to %s: the Proxy is closed", addr)
	}
	p.drain()
	if p.stream != nil {
		p.stream.cancel()
		p.stream = nil
		p.ends = append(p.ends, p.now)
	}
	old := p.conn
	p.conn, p.client = conn, rlqspb.NewRateLimitQuotaServiceClient(conn)
	p.mu.Unlock()
	return old.Close()
}
