package sluiceclient

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/checkapi"
)

// maxSenders is how many batches of gathered checks may be on the wire
// at once, besides the lone checks callers send themselves. One: while
// its batch is on the wire the next gathers, so 64 callers go in two
// alternating batches of about 32. Two and four senders split them into
// batches of about 17 and 9 and took more CPU per check on both stores,
// client and server together (bench/results/2026-12-07-oneroad.md).
const maxSenders = 1

// The life of a gathered check: a sender takes it (sent) unless its
// caller gave up first (abandoned).
const (
	queued int32 = iota
	sent
	abandoned
)

// coalescer gathers the checks that find a request of the Client on the
// wire, and sends them together: a caller that finds nothing on the wire
// sends its check itself, at once, as POST /v1/check. Callers that arrive
// while something is on the wire wait in the queue; up to maxSenders
// goroutines, each started when a check is queued and none is free, take
// everything queued (up to checkapi.MaxChecks), send it as one POST
// /v1/checks (a lone check as a POST /v1/check) and hand each check its
// own answer; a sender ends when it finds the queue empty, or passes its
// place on as its batch's answer arrives (sendGathered). No timer ever
// holds a check back.
type coalescer struct {
	mu      sync.Mutex
	wire    int // requests on the wire: lone checks and batches
	senders int // goroutines sending batches
	queue   []*gathered
	single  atomic.Bool // the server has no /v1/checks (404): every check alone
}

// gathered is one check waiting for, or on, the wire in a batch.
type gathered struct {
	data  []byte // its JSON
	req   *sluice.Request
	state atomic.Int32
	done  chan struct{} // closed when answered is set
	answered
}

// answered is the answer of a check's first attempt, in a batch.
type answered struct {
	o     sluice.Outcome
	retry bool // lost or Indeterminate: retried as Check retries it
	alone bool // not decided: the server refused the batch; send it alone
}

// coalesce sends the check data, of req, alone when nothing of c is on
// the wire, else gathered with others (see coalescer), and returns its
// outcome, retried as send retries one.
func (c *Client) coalesce(ctx context.Context, data []byte, req *sluice.Request, retries int) sluice.Outcome {
	co := c.co
	url := c.base + checkapi.CheckPath
	co.mu.Lock()
	if co.single.Load() || co.wire == 0 && len(co.queue) == 0 {
		co.wire++
		co.mu.Unlock()
		defer func() {
			co.mu.Lock()
			co.wire--
			co.mu.Unlock()
		}()
		return c.send(ctx, url, data, req, retries, nil)
	}
	g := &gathered{data: data, req: req, done: make(chan struct{})}
	co.queue = append(co.queue, g)
	if co.senders < maxSenders {
		co.senders++
		go c.sendGathered()
	}
	co.mu.Unlock()
	select {
	case <-g.done:
	case <-ctx.Done():
		if g.state.CompareAndSwap(queued, abandoned) {
			return sluice.Outcome{Kind: sluice.Unavailable, Cause: sluice.DeadlinePassed, Err: fmt.Errorf("sluiceclient: nothing sent: %w", ctx.Err())}
		}
		return lost(fmt.Errorf("sent, no answer before the caller's deadline: %w", ctx.Err()))
	}
	if g.alone {
		return c.send(ctx, url, data, req, retries, nil)
	}
	return c.send(ctx, url, data, req, retries, &g.answered)
}

// sendGathered sends what is queued, a batch at a time, until the queue
// is empty. Once a batch's answer has arrived, the sender's place passes
// to a new goroutine when more checks wait, so that the next batch is on
// the wire, decided by the server, while this one's answer is decoded
// and handed out: with one sender the server otherwise idled through
// every decoding.
func (c *Client) sendGathered() {
	co := c.co
	for {
		co.mu.Lock()
		batch := co.take()
		if len(batch) == 0 {
			co.senders--
			co.mu.Unlock()
			return
		}
		co.wire++
		co.mu.Unlock()
		answer := func() {}
		if co.single.Load() {
			for _, g := range batch {
				g.alone = true // the server said it has no /v1/checks
			}
		} else {
			answer = c.sendBatch(batch)
		}
		co.mu.Lock()
		co.wire--
		next := len(co.queue) > 0
		if next {
			go c.sendGathered() // this sender's place, passed on
		}
		co.mu.Unlock()
		answer()
		for _, g := range batch {
			close(g.done)
		}
		if next {
			return
		}
	}
}

// take moves up to checkapi.MaxChecks queued checks into a batch of
// their own, skipping the abandoned. co.mu is held.
func (co *coalescer) take() []*gathered {
	var batch []*gathered
	n := 0
	for ; n < len(co.queue) && len(batch) < checkapi.MaxChecks; n++ {
		if g := co.queue[n]; g.state.CompareAndSwap(queued, sent) {
			if batch == nil {
				batch = make([]*gathered, 0, min(len(co.queue), checkapi.MaxChecks))
			}
			batch = append(batch, g)
		}
		co.queue[n] = nil
	}
	co.queue = co.queue[n:]
	if len(co.queue) == 0 {
		co.queue = nil
	}
	return batch
}

// sendBatch sends batch's checks in one request, under the Client's own
// context (no caller's cancellation reaches the others), and returns once
// its answer has arrived, with answer, which decodes it and sets each
// check's own.
func (c *Client) sendBatch(batch []*gathered) (answer func()) {
	ctx, cancel := context.WithTimeout(context.Background(), c.attempt)
	defer cancel()
	if len(batch) == 1 {
		g := batch[0]
		g.o, g.retry = c.once(ctx, c.base+checkapi.CheckPath, g.data, g.req)
		return func() {}
	}
	body := append(make([]byte, 0, 16+len(batch)*(len(batch[0].data)+1)), `{"checks":[`...)
	for i, g := range batch {
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, g.data...)
	}
	body = append(body, "]}"...)
	code, raw, err := c.post(ctx, c.base+checkapi.ChecksPath, body, 64<<20)
	if err != nil {
		o, retry := unanswered(err)
		for _, g := range batch {
			g.o, g.retry = o, retry
		}
		return func() {}
	}
	if code == http.StatusNotFound {
		c.co.single.Store(true) // an older server: no /v1/checks
	}
	return func() { c.answerBatch(batch, code, raw) }
}

// answerBatch sets the answer of each check of batch from raw, the body
// of the answer to its POST /v1/checks, of status code.
func (c *Client) answerBatch(batch []*gathered, code int, raw []byte) {
	if code == http.StatusOK {
		if a, err := checkapi.ParseBatchAnswer(raw, len(batch)); err == nil {
			for i, g := range batch {
				g.o, g.retry = outcome(a.Results[i].Status, &a.Results[i].Answer, g.req)
			}
			return
		}
	}
	a, err := checkapi.ParseAnswer(raw)
	for _, g := range batch {
		switch {
		case code == http.StatusNotFound:
			g.alone = true // an older server: no /v1/checks
		case err == nil && (code == http.StatusUnauthorized || code == http.StatusForbidden):
			g.o, g.retry = outcome(code, &a, g.req) // each alone would be answered the same
		case code >= 500 || code == http.StatusOK:
			g.o, g.retry = lost(fmt.Errorf("%d from %s: not a batch answer", code, checkapi.ChecksPath)), true
		default:
			g.alone = true // refused whole, nothing decided (a body over a gateway's bound…)
		}
	}
}

// post sends body to url and returns the answer's status and body, read
// up to limit bytes: an error when no answer arrived.
func (c *Client) post(ctx context.Context, url string, body []byte, limit int64) (int, []byte, error) {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	if c.token != "" {
		hreq.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(hreq)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return 0, nil, fmt.Errorf("read answer: %w", err)
	}
	return resp.StatusCode, raw, nil
}
