package main

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// proxy is a TCP proxy on a loopback port between sluice serve and
// Redis: it forwards to a target that can be changed (a failover), and
// can delay every chunk of bytes each way (added latency). Safe for
// concurrent use.
type proxy struct {
	ln     net.Listener
	target atomic.Pointer[string]
	delay  atomic.Int64 // ns added to each chunk, each way
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// startProxy listens on a free loopback port and forwards to target.
func startProxy(target string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, conns: map[net.Conn]struct{}{}}
	p.target.Store(&target)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address sluice serve dials.
func (p *proxy) Addr() string { return p.ln.Addr().String() }

// setDelay delays every chunk forwarded from now on by d, each way.
func (p *proxy) setDelay(d time.Duration) { p.delay.Store(int64(d)) }

// retarget forwards new connections to target and closes the current
// ones, as a client's connections to a failed master end.
func (p *proxy) retarget(target string) {
	p.target.Store(&target)
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Close stops accepting, closes every connection and waits for the
// goroutines that served them.
func (p *proxy) Close() {
	p.ln.Close()
	p.retarget("")
	p.wg.Wait()
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.DialTimeout("tcp", *p.target.Load(), time.Second)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c, up) {
			return
		}
		p.wg.Add(2)
		go p.pipe(up, c)
		go p.pipe(c, up)
	}
}

// track records both ends of a connection, false once the proxy is closed.
func (p *proxy) track(c, up net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if *p.target.Load() == "" {
		c.Close()
		up.Close()
		return false
	}
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	return true
}

// chunk is bytes read at a time, to be written delay later.
type chunk struct {
	b    []byte
	when time.Time
}

// pipe copies from src to dst, each chunk written no sooner than the
// delay set when it was read, in order; then closes both.
func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	queue := make(chan chunk, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ch := range queue {
			time.Sleep(time.Until(ch.when))
			if _, err := dst.Write(ch.b); err != nil {
				break
			}
		}
		for range queue { // the reader stops once both ends are closed
		}
	}()
	var err error
	for err == nil {
		buf := make([]byte, 32<<10)
		var n int
		n, err = src.Read(buf)
		if n > 0 {
			queue <- chunk{buf[:n], time.Now().Add(time.Duration(p.delay.Load()))}
		}
	}
	close(queue)
	<-done
	src.Close()
	dst.Close()
	p.mu.Lock()
	delete(p.conns, src)
	delete(p.conns, dst)
	p.mu.Unlock()
}
