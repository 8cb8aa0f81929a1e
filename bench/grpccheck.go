package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/checkpb"
)

// callersPerStream is how many callers of a CheckStream row share one
// stream: as many as the server decides at once on one
// (internal/server's streamInFlight), so 64 callers are one stream.
const callersPerStream = 64

// streamDecide returns a decideFunc that asks sluice serve's gRPC check
// service (sluice.v1.CheckService, on the listener at addr that serves
// Envoy) over one connection: callers share ceil(callers/64) CheckStream
// calls, a request's id naming the slot its answer goes back to. 200 is
// an admission, 429 a denial, anything else an error.
func streamDecide(addr, policy string, subjects []string, callers int) (decideFunc, func()) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return func(context.Context, int) (int, error) { return 0, err }, func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	release := func() { cancel(); conn.Close() }
	client := checkpb.NewCheckServiceClient(conn)
	streams := make([]*checkStream, (callers+callersPerStream-1)/callersPerStream)
	// A slot is one call in flight: its id, and the channel its answer
	// comes back on. A caller takes a free one for each check.
	answers := make([]chan *checkpb.CheckResponse, callers)
	ids := make([]string, callers)
	free := make(chan int, callers)
	for k := range callers {
		answers[k], ids[k] = make(chan *checkpb.CheckResponse, 1), strconv.Itoa(k)
		free <- k
	}
	for i := range streams {
		s, err := client.CheckStream(ctx)
		if err != nil {
			release()
			return func(context.Context, int) (int, error) { return 0, err }, func() {}
		}
		streams[i] = &checkStream{s: s, dead: make(chan struct{})}
		go streams[i].receive(answers)
	}
	return func(ctx context.Context, i int) (int, error) {
		var k int
		select {
		case k = <-free:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		st := streams[k%len(streams)]
		st.mu.Lock()
		err := st.s.Send(&checkpb.CheckRequest{Id: ids[k], Policy: policy, Subject: subjects[i]})
		st.mu.Unlock()
		if err != nil {
			return 0, fmt.Errorf("CheckStream: send: %w", err) // the slot stays taken: its stream is gone
		}
		var resp *checkpb.CheckResponse
		select {
		case resp = <-answers[k]:
		case <-st.dead:
			return 0, fmt.Errorf("CheckStream: %w", st.err)
		case <-ctx.Done():
			return 0, ctx.Err() // the slot stays taken: its answer may still come
		}
		free <- k
		switch resp.HttpStatus {
		case http.StatusOK:
			return 1, nil
		case http.StatusTooManyRequests:
			return 0, nil
		}
		return 0, fmt.Errorf("CheckStream: an answer of %d (%s)", resp.HttpStatus, resp.Reason)
	}, release
}

// checkStream is one CheckStream call of streamDecide: its sends, one at
// a time, and its receiving goroutine's end.
type checkStream struct {
	mu   sync.Mutex
	s    checkpb.CheckService_CheckStreamClient
	dead chan struct{} // closed when receive ends; err says why
	err  error
}

// receive hands each answer to the slot its id names, until the stream
// ends.
func (st *checkStream) receive(answers []chan *checkpb.CheckResponse) {
	defer close(st.dead)
	for {
		resp, err := st.s.Recv()
		if err != nil {
			st.err = err
			return
		}
		k, err := strconv.Atoi(resp.Id)
		if err != nil || k < 0 || k >= len(answers) {
			st.err = errors.New("an answer with an id no request had: " + strconv.Quote(resp.Id))
			return
		}
		answers[k] <- resp
	}
}
