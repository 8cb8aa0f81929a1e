// Package faultproxy is a TCP proxy for fault tests: it listens on a free
// loopback port and forwards every connection to one upstream address,
// unless told to misbehave. Each fault applies from the moment it is set,
// to connections already open and to new ones alike:
//
//   - Latency delays every chunk of bytes, in both directions; a chunk
//     waiting when the faults change is delivered as the new ones say
//     (at once once the latency is cleared);
//   - Hang stops forwarding: connections are accepted, bytes are read
//     and held, nothing is answered, until Forward (then what was held
//     flows on, as after a SIGSTOP'd server is continued);
//   - ResetAfter forwards n more bytes from the client on each
//     connection, then resets it (RST), closing the upstream side gently
//     so that a command complete within those n bytes still runs; no
//     reply to those bytes reaches the client;
//   - ResetOnReply forwards what the client sends and resets the client's
//     connection instead of delivering the upstream's reply: the command
//     ran and its answer is lost;
//   - Drop closes every open connection at once.
//
// A Proxy is safe for concurrent use. Its goroutines (one accepting, two
// per connection) stop on Close, which waits for them.
package faultproxy

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards TCP connections to an upstream address, with faults.
// Create it with New; the zero value is not usable.
type Proxy struct {
	upstream string
	l        net.Listener
	done     chan struct{} // closed by Close
	wg       sync.WaitGroup

	mu         sync.Mutex
	latency    time.Duration
	hung       bool
	resetAfter int64 // bytes from the client still forwarded; -1: no such fault
	resetGen   int64 // bumped by ResetAfter, so each link counts anew
	resetReply bool
	changed    chan struct{} // closed and replaced when a fault changes
	links      map[*link]struct{}
	closed     bool
	accepted   int64
	delayed    int64 // chunks delivered after waiting out a latency
}

// link is one proxied connection: the client's and the upstream's.
type link struct {
	client, upstream net.Conn
	once             sync.Once
	cut              atomic.Bool // being reset: deliver nothing more to the client
	mu               sync.Mutex
	gen              int64 // resetGen the count below belongs to
	sent             int64 // client bytes forwarded since gen was set
}

// New starts a proxy to upstream (host:port) on a free loopback port.
// The caller must Close it.
func New(upstream string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	p := &Proxy{upstream: upstream, l: l, done: make(chan struct{}), resetAfter: -1,
		changed: make(chan struct{}), links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port, e.g. "127.0.0.1:40123".
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Accepted is how many connections the proxy has accepted so far.
func (p *Proxy) Accepted() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Delayed is how many chunks of bytes the proxy has delivered after
// waiting out a latency: a test's sign that SetLatency took effect.
func (p *Proxy) Delayed() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delayed
}

// set changes the faults under the lock and wakes every waiting pump.
func (p *Proxy) set(f func()) {
	p.mu.Lock()
	f()
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// Forward clears every fault: bytes flow both ways at once.
func (p *Proxy) Forward() {
	p.set(func() { p.latency, p.hung, p.resetAfter, p.resetReply = 0, false, -1, false })
}

// SetLatency delays each chunk of bytes, either way, by d (0: none).
func (p *Proxy) SetLatency(d time.Duration) { p.set(func() { p.latency = d }) }

// Hang holds every byte, either way, until Forward: the upstream looks
// like a server that accepts connections and never answers.
func (p *Proxy) Hang() { p.set(func() { p.hung = true }) }

// ResetAfter forwards n more bytes from the client on each connection,
// then resets that connection.
func (p *Proxy) ResetAfter(n int64) {
	p.set(func() { p.resetAfter, p.resetGen = n, p.resetGen+1 })
}

// ResetOnReply resets a client's connection when its reply comes, instead
// of delivering it.
func (p *Proxy) ResetOnReply() { p.set(func() { p.resetReply = true }) }

// Drop closes every open connection; new ones are accepted as before.
func (p *Proxy) Drop() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for lk := range p.links {
		links = append(links, lk)
	}
	p.mu.Unlock()
	for _, lk := range links {
		lk.close(false)
	}
}

// Close stops the proxy: it closes the listener and every connection and
// waits for its goroutines. It is safe to call more than once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	p.mu.Unlock()
	err := p.l.Close()
	p.Drop()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed
		}
		up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
		if err != nil {
			c.Close() // as a server that is down: accepted, then closed
			continue
		}
		lk := &link{client: c, upstream: up}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			up.Close()
			return
		}
		p.links[lk] = struct{}{}
		p.accepted++
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pump(lk, true)
		go p.pump(lk, false)
	}
}

// pump copies one direction of lk, applying the faults.
func (p *Proxy) pump(lk *link, fromClient bool) {
	defer p.wg.Done()
	defer p.forget(lk)
	src, dst := lk.upstream, lk.client
	if fromClient {
		src, dst = lk.client, lk.upstream
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.deliver(lk, fromClient, dst, buf[:n]) {
			lk.close(false)
			return
		}
		if err != nil {
			// One side finished: finish the other, and forget the link.
			if tc, ok := dst.(*net.TCPConn); ok && fromClient {
				tc.CloseWrite()
			} else {
				lk.close(false)
			}
			return
		}
	}
}

// deliver writes b to dst once the faults allow, and reports whether the
// link is still usable.
func (p *Proxy) deliver(lk *link, fromClient bool, dst net.Conn, b []byte) bool {
	for {
		p.mu.Lock()
		hung, latency, changed := p.hung, p.latency, p.changed
		resetAfter, gen, resetReply := p.resetAfter, p.resetGen, p.resetReply
		p.mu.Unlock()
		if hung {
			select {
			case <-changed:
				continue
			case <-p.done:
				return false
			}
		}
		if latency > 0 {
			t := time.NewTimer(latency)
			select {
			case <-t.C:
				p.mu.Lock()
				p.delayed++
				p.mu.Unlock()
			case <-changed:
				t.Stop()
				continue
			case <-p.done:
				t.Stop()
				return false
			}
		}
		switch {
		case !fromClient && (resetReply || lk.cut.Load()):
			lk.close(true)
			return false
		case fromClient && resetAfter >= 0:
			lk.mu.Lock()
			if lk.gen != gen {
				lk.gen, lk.sent = gen, 0
			}
			room := resetAfter - lk.sent
			if room > int64(len(b)) {
				lk.sent += int64(len(b))
				lk.mu.Unlock()
				break
			}
			lk.sent = resetAfter
			lk.mu.Unlock()
			lk.cut.Store(true) // no reply to what goes up now reaches the client
			if room > 0 {
				dst.Write(b[:room])
			}
			lk.close(true)
			return false
		}
		_, err := dst.Write(b)
		return err == nil
	}
}

func (p *Proxy) forget(lk *link) {
	p.mu.Lock()
	delete(p.links, lk)
	p.mu.Unlock()
}

// close closes both sides of lk once; reset makes the client's side an
// RST instead of an orderly close. The upstream side always closes
// gently, so what was forwarded to it is still read.
func (lk *link) close(reset bool) {
	lk.once.Do(func() {
		if tc, ok := lk.client.(*net.TCPConn); ok && reset {
			tc.SetLinger(0)
		}
		lk.client.Close()
		lk.upstream.Close()
	})
}
