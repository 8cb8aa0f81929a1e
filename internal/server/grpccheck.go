package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/checkpb"
)

// The gRPC check service: sluice.v1.CheckService
// (proto/sluice/v1/check.proto, docs/grpc-check.md), POST /v1/check over
// gRPC on the listener that serves Envoy. Each check is decided by
// decideCheck, as POST /v1/check decides it, with the token of the call's
// "authorization" metadata, and logged and counted as the HTTP API logs
// and counts its requests.

// The service's methods, as the request log and the metrics name them.
const (
	checkMethod       = "/sluice.v1.CheckService/Check"
	checkStreamMethod = "/sluice.v1.CheckService/CheckStream"
)

// streamInFlight is how many checks of one CheckStream are decided at
// once: as many as redisstore sends in one round trip. With that many
// in flight the stream reads no further message until one is answered,
// so a stream holds at most streamInFlight requests and answers besides
// what gRPC's flow control buffers.
const streamInFlight = 64

// checkService serves sluice.v1.CheckService. It is safe for concurrent
// use and owns no goroutines beyond a stream's calls: CheckStream
// returns only once every check it started is answered or abandoned.
type checkService struct {
	checkpb.UnimplementedCheckServiceServer
	// server returns the Server to decide a check with, and its release,
	// called once the check is decided: the generation serving (Run), or
	// one Server (RegisterCheckService).
	server func() (*Server, func())
}

// RegisterCheckService registers sluice.v1.CheckService on gs, deciding
// every check with s. Run registers its own, which decides each check
// with the configuration serving when it arrives.
func RegisterCheckService(gs grpc.ServiceRegistrar, s *Server) {
	checkpb.RegisterCheckServiceServer(gs, &checkService{server: func() (*Server, func()) { return s, func() {} }})
}

// Check decides one check. A decision (200, 429, 503) is an answer; a
// refused request (400, 401, 403, 404, 422) the gRPC status grpcCode
// maps it to, whose details carry the answer POST /v1/check gives.
func (c *checkService) Check(ctx context.Context, in *checkpb.CheckRequest) (*checkpb.CheckResponse, error) {
	srv, release := c.server()
	resp := srv.checkOne(ctx, checkMethod, in)
	release()
	if code := grpcCode(resp.HttpStatus); code != codes.OK {
		st, err := status.New(code, resp.Reason).WithDetails(resp)
		if err != nil {
			return nil, status.Error(code, resp.Reason)
		}
		return nil, st.Err()
	}
	return resp, nil
}

// grpcCode returns the gRPC status of an answer with HTTP status
// httpStatus: OK for a decision, whatever its outcome, and for a refusal
// the code of the same meaning.
func grpcCode(httpStatus int32) codes.Code {
	switch httpStatus {
	case http.StatusBadRequest:
		return codes.InvalidArgument
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound:
		return codes.NotFound
	case http.StatusUnprocessableEntity:
		return codes.FailedPrecondition
	}
	return codes.OK
}

// CheckStream decides each request message and sends its answer, the
// request's id echoed, as decisions complete: up to streamInFlight at
// once, so the store batches them. Every message gets an answer, a
// refused one included; a call without a valid token ends with
// Unauthenticated before any is read. When the client ends its side the
// stream ends once the last answer is sent; when the stream is cut, the
// checks in flight end with their context and the method returns once
// they have: a check is decided whole by the store or not at all, as
// when an HTTP client hangs up.
func (c *checkService) CheckStream(stream checkpb.CheckService_CheckStreamServer) error {
	srv, release := c.server()
	_, err := srv.grpcToken(stream.Context())
	release()
	if err != nil {
		return status.Error(codes.Unauthenticated, err.Error())
	}
	cs := &checkStream{svc: c, stream: stream, slots: make(chan struct{}, streamInFlight)}
	defer cs.wg.Wait()
	for {
		cs.slots <- struct{}{} // backpressure: no read while streamInFlight are in flight
		in, err := stream.Recv()
		if err != nil {
			cs.wg.Wait()
			cs.sendMu.Lock()
			defer cs.sendMu.Unlock()
			switch {
			case !errors.Is(err, io.EOF):
				return err
			case cs.sendErr != nil:
				return cs.sendErr
			}
			return nil
		}
		cs.wg.Add(1)
		go cs.check(in)
	}
}

// checkStream is one CheckStream call: its checks in flight, each
// holding a slot, and its sends, one at a time.
type checkStream struct {
	svc     *checkService
	stream  checkpb.CheckService_CheckStreamServer
	wg      sync.WaitGroup
	slots   chan struct{}
	sendMu  sync.Mutex
	sendErr error // the first send's that failed; no send after it
}

// check decides in, a message of the stream, and sends its answer
// unless a send has failed already, then frees its slot.
func (cs *checkStream) check(in *checkpb.CheckRequest) {
	defer func() { <-cs.slots; cs.wg.Done() }()
	srv, release := cs.svc.server()
	resp := srv.checkOne(cs.stream.Context(), checkStreamMethod, in)
	release()
	cs.sendMu.Lock()
	if cs.sendErr == nil {
		cs.sendErr = cs.stream.Send(resp)
	}
	cs.sendMu.Unlock()
}

// grpcToken returns the token of the call's "authorization" metadata
// (its first value, as an HTTP header's), nil when no tokens are
// configured, or errUnauthenticated.
func (s *Server) grpcToken(ctx context.Context) (*authToken, error) {
	if s.auth == nil {
		return nil, nil
	}
	var authorization string
	if v := metadata.ValueFromIncomingContext(ctx, "authorization"); len(v) > 0 {
		authorization = v[0]
	}
	return s.auth.authenticate(authorization)
}

// refused is the outcome of a check refused before the edge core.
var refused = sluice.Outcome{Kind: sluice.Incompatible}

// checkOne answers in, a check of the gRPC method, as POST /v1/check
// answers its body: authenticated, bounded to the check API's body size,
// decided by decideCheck, logged and counted.
func (s *Server) checkOne(ctx context.Context, method string, in *checkpb.CheckRequest) *checkpb.CheckResponse {
	start := s.clock.Now()
	req := checkapi.FromProto(in)
	lw := logWriter{}
	var d decided
	tok, err := s.grpcToken(ctx)
	switch {
	case err != nil:
		d = decided{o: refused, code: http.StatusUnauthorized, reason: err.Error()}
		lw.reason = d.reason
	case int64(proto.Size(in)) > s.maxBody:
		d = decided{o: refused, code: http.StatusBadRequest, reason: fmt.Sprintf("request message is larger than %d bytes", s.maxBody)}
		lw.reason = d.reason
	default:
		d = s.decideCheck(ctx, &req, tok)
		switch {
		case d.decided:
			d.record(&lw, &req)
		case d.code == http.StatusForbidden:
			lw.reason = "token lacks scope " + d.scope
		default:
			lw.reason = d.reason
		}
	}
	if tok != nil {
		lw.token = tok.id
	}
	lw.status = d.code
	s.logRequest(ctx, "GRPC", method, &lw, s.clock.Now().Sub(start))
	if s.metrics != nil {
		s.metrics.countRequest(method, d.code)
	}
	return checkapi.ToProto(in.Id, d.code, &d.o, d.reason)
}
