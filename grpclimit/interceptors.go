package grpclimit

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/edge"
)

// The trailer metadata keys of the draft's fields.
const (
	mdPolicy = "ratelimit-policy"
	mdLimit  = "ratelimit"
)

// unavailableRetry is the retry delay of a call answered Unavailable:
// HTTP's Retry-After of a 503, 1s.
const unavailableRetry = time.Second

// Unary returns the unary server interceptor, for grpc.UnaryInterceptor
// or grpc.ChainUnaryInterceptor. A call whose method no rule limits goes
// straight to the handler.
func (in *Interceptors) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		r := in.ruleOf(info.FullMethod)
		if r == nil {
			return handler(ctx, req)
		}
		a, s, err := in.decide(ctx, info.FullMethod, r, func(md metadata.MD) error { return grpc.SetTrailer(ctx, md) })
		if err != nil {
			return nil, err
		}
		defer in.core.Release(ctx, &a) // on return and on panic alike
		if r.settle != "" && a.Kind == edge.Admit {
			return in.unarySettled(ctx, req, handler, r, &a, s)
		}
		return handler(ctx, req)
	}
}

// Stream returns the stream server interceptor, for grpc.StreamInterceptor
// or grpc.ChainStreamInterceptor. A concurrency policy's lease is held
// until the stream's handler returns.
func (in *Interceptors) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		r := in.ruleOf(info.FullMethod)
		if r == nil {
			return handler(srv, ss)
		}
		ctx := ss.Context()
		a, s, err := in.decide(ctx, info.FullMethod, r, func(md metadata.MD) error { ss.SetTrailer(md); return nil })
		if err != nil {
			return err
		}
		defer in.core.Release(ctx, &a) // on return and on panic alike
		if r.settle != "" && a.Kind == edge.Admit {
			return in.streamSettled(srv, ss, handler, r, &a, s)
		}
		return handler(srv, ss)
	}
}

// Limit decides the server call whose context is ctx as the interceptors
// would, for go-grpc-middleware's ratelimit interceptors, whose Limiter
// interface it implements: nil when the call may go on, else the status
// error the interceptors answer with (that ratelimit interceptor answers
// codes.ResourceExhausted with its message instead, without the details;
// the trailer fields are set either way).
//
// Limit cannot hold a lease, since that interface has no call at the
// end: a method whose policies include a concurrency policy is refused,
// codes.FailedPrecondition, and logged. Use Unary and Stream for those.
func (in *Interceptors) Limit(ctx context.Context) error {
	method, ok := grpc.Method(ctx)
	if !ok {
		return status.Error(codes.Internal, "grpclimit: Limit: ctx is not the context of a gRPC server call")
	}
	r := in.ruleOf(method)
	if r == nil {
		return nil
	}
	if r.Lease != "" {
		in.core.Log(ctx, slog.LevelWarn, "grpclimit: Limit cannot hold a lease: use the Unary and Stream interceptors for this method", slog.String("method", method), slog.String("policy", r.Lease))
		return status.Errorf(codes.FailedPrecondition, "grpclimit: Limit cannot hold the lease of concurrency policy %q that %s needs", r.Lease, method)
	}
	if r.settle != "" {
		in.core.Log(ctx, slog.LevelWarn, "grpclimit: Limit cannot settle an estimate: use the Unary and Stream interceptors for this method", slog.String("method", method))
		return status.Errorf(codes.FailedPrecondition, "grpclimit: Limit cannot settle the estimate %s spends (SettleTrailer)", method)
	}
	_, _, err := in.decide(ctx, method, r, func(md metadata.MD) error { return grpc.SetTrailer(ctx, md) })
	return err
}

// decide asks the core about a call of method and rule r whose context is ctx, sets
// the call's trailer fields with setTrailer, and returns the action (whose
// lease to release after the call), the subject it was decided for (whose
// estimate to settle) and the error to answer with (nil: the call goes
// on).
func (in *Interceptors) decide(ctx context.Context, method string, r *rule, setTrailer func(metadata.MD) error) (edge.Action, edge.Subject, error) {
	kind, identity := r.subject(request(ctx, method))
	if identity == "" {
		if in.passAnonymous {
			return edge.Action{}, edge.Subject{}, nil
		}
		return edge.Action{}, edge.Subject{}, status.Error(codes.Unauthenticated, "grpclimit: the call carries no identity this method is rate limited by")
	}
	s := edge.Subject{
		ID:       in.pseudo.Pseudonym(kind, identity, r.operation),
		Previous: in.pseudo.Previous(kind, identity, r.operation),
		Priority: r.priority,
	}
	if r.classOf != nil {
		if c := r.classOf(ctx, method); c != "" {
			s.Priority = c
		}
	}
	if r.settle != "" {
		s.EvaluationID = edge.SettleID(s)
	}
	a := in.core.Decide(ctx, r.Rule, s)
	md := metadata.MD{mdPolicy: {r.Field}}
	if l := a.LimitField(); l != "" {
		md[mdLimit] = []string{l}
	}
	_ = setTrailer(md) // fails only once the call has ended
	switch a.Kind {
	case edge.Admit:
		return a, s, nil
	case edge.Limit:
		return edge.Action{}, s, in.denial(kind, a.Decided())
	case edge.Abandoned:
		return edge.Action{}, s, status.Error(codes.Canceled, "grpclimit: the call ended while held for its slot; the slot was given back")
	}
	in.core.Log(ctx, slog.LevelWarn, "sluice: no rate limit decision", slog.String("operation", r.operation), slog.String("policies", strings.Join(r.Policies, ",")),
		slog.String("subject", s.ID), slog.String("outcome", a.Outcome.Kind.String()), slog.String("cause", a.Outcome.Cause.String()), slog.Any("error", a.Outcome.Err),
		slog.Bool("failed_closed", a.Kind == edge.FailClosed))
	if a.Kind == edge.FailOpen {
		return edge.Action{}, s, nil
	}
	return edge.Action{}, s, withDetails(status.New(codes.Unavailable, "grpclimit: the rate limiter could not decide; retry shortly"),
		&errdetails.RetryInfo{RetryDelay: durationpb.New(unavailableRetry)})
}

// denial is the status error of the denied outcome o of a subject of
// kind: ResourceExhausted with a RetryInfo at least the wait o names and
// a QuotaFailure listing the policies that denied.
func (in *Interceptors) denial(kind string, o *sluice.Outcome) error {
	retry := o.RetryAfter
	if r := retry.Truncate(time.Millisecond); r < retry { // whole milliseconds, never less than the wait
		retry = r + time.Millisecond
	}
	var quota errdetails.QuotaFailure
	var ids []string
	for _, s := range edge.Statuses(o) {
		if s.Allowed {
			continue
		}
		ids = append(ids, strconv.Quote(s.Policy))
		quota.Violations = append(quota.Violations, &errdetails.QuotaFailure_Violation{
			Subject:     kind,
			QuotaId:     s.Policy,
			QuotaValue:  s.Limit,
			Description: fmt.Sprintf("quota of policy %q exceeded; retry %s", s.Policy, in.core.RetryWhen(s.RetryAfter)),
		})
	}
	msg := fmt.Sprintf("grpclimit: rate limited by policy %s; retry %s", strings.Join(ids, ", "), in.core.RetryWhen(retry))
	return withDetails(status.New(codes.ResourceExhausted, msg), &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)}, &quota)
}

// withDetails is st's error with details attached.
func withDetails(st *status.Status, details ...protoadapt.MessageV1) error {
	if d, err := st.WithDetails(details...); err == nil { // fails only for an OK status
		st = d
	}
	return st.Err()
}
