package grpclimit

import (
	"context"
	"fmt"
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
	"github.com/sluicehq/sluice/internal/clock"
	"github.com/sluicehq/sluice/internal/ratelimitheader"
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
		lease, err := in.decide(ctx, r, func(md metadata.MD) error { return grpc.SetTrailer(ctx, md) })
		if err != nil {
			return nil, err
		}
		defer in.release(ctx, lease) // on return and on panic alike
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
		lease, err := in.decide(ctx, r, func(md metadata.MD) error { ss.SetTrailer(md); return nil })
		if err != nil {
			return err
		}
		defer in.release(ctx, lease) // on return and on panic alike
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
	if r.lease != "" {
		in.warn(ctx, "grpclimit: Limit cannot hold a lease: use the Unary and Stream interceptors for this method", "method", method, "policy", r.lease)
		return status.Errorf(codes.FailedPrecondition, "grpclimit: Limit cannot hold the lease of concurrency policy %q that %s needs", r.lease, method)
	}
	_, err := in.decide(ctx, r, func(md metadata.MD) error { return grpc.SetTrailer(ctx, md) })
	return err
}

// decide asks the limiter about a call of rule r whose context is ctx,
// sets the call's trailer fields with setTrailer, and returns the lease
// to release after the call (the zero Lease for none) and the error to
// answer with (nil: the call goes on).
func (in *Interceptors) decide(ctx context.Context, r *rule, setTrailer func(metadata.MD) error) (sluice.Lease, error) {
	kind, identity := r.subject(ctx)
	if identity == "" {
		if in.passAnonymous {
			return sluice.Lease{}, nil
		}
		return sluice.Lease{}, status.Error(codes.Unauthenticated, "grpclimit: the call carries no identity this method is rate limited by")
	}
	req := sluice.Request{
		Op:       r.op,
		Subject:  in.pseudo.Pseudonym(kind, identity, r.operation),
		Previous: in.pseudo.Previous(kind, identity, r.operation),
		Cost:     r.cost,
	}
	if len(r.policies) == 1 {
		req.Policy = r.policies[0]
	} else {
		req.Policies = r.policies
	}
	dctx, cancel := context.WithTimeout(ctx, in.deadline)
	o := in.limiter.Check(dctx, req)
	cancel()
	md := metadata.MD{mdPolicy: {r.policyField}}
	if o.Kind == sluice.Allowed || o.Kind == sluice.Denied {
		md[mdLimit] = []string{string(ratelimitheader.AppendLimitField(nil, o))}
	}
	_ = setTrailer(md) // fails only once the call has ended
	switch o.Kind {
	case sluice.Allowed:
		return o.Lease, nil
	case sluice.Denied:
		return sluice.Lease{}, denial(kind, o)
	}
	in.warn(ctx, "sluice: no rate limit decision", "operation", r.operation, "policies", strings.Join(r.policies, ","),
		"subject", req.Subject, "outcome", o.Kind.String(), "cause", o.Cause.String(), "error", o.Err, "failed_closed", r.closed)
	if !r.closed {
		return sluice.Lease{}, nil
	}
	return sluice.Lease{}, withDetails(status.New(codes.Unavailable, "grpclimit: the rate limiter could not decide; retry shortly"),
		&errdetails.RetryInfo{RetryDelay: durationpb.New(unavailableRetry)})
}

// denial is the status error of the denied outcome o of a subject of
// kind: ResourceExhausted with a RetryInfo at least the wait o names and
// a QuotaFailure listing the policies that denied.
func denial(kind string, o sluice.Outcome) error {
	retry := o.RetryAfter
	if r := retry.Truncate(time.Millisecond); r < retry { // whole milliseconds, never less than the wait
		retry = r + time.Millisecond
	}
	var quota errdetails.QuotaFailure
	var ids []string
	for _, s := range statuses(o) {
		if s.Allowed {
			continue
		}
		ids = append(ids, strconv.Quote(s.Policy))
		quota.Violations = append(quota.Violations, &errdetails.QuotaFailure_Violation{
			Subject:     kind,
			QuotaId:     s.Policy,
			QuotaValue:  s.Limit,
			Description: fmt.Sprintf("quota of policy %q exceeded; retry in %d s", s.Policy, ratelimitheader.RetryAfterSeconds(s.RetryAfter)),
		})
	}
	msg := fmt.Sprintf("grpclimit: rate limited by policy %s; retry in %d s", strings.Join(ids, ", "), ratelimitheader.RetryAfterSeconds(retry))
	return withDetails(status.New(codes.ResourceExhausted, msg), &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)}, &quota)
}

// statuses is every policy's status of o.
func statuses(o sluice.Outcome) []sluice.Status {
	if len(o.Statuses) == 0 {
		return []sluice.Status{o.Status}
	}
	return o.Statuses
}

// withDetails is st's error with details attached.
func withDetails(st *status.Status, details ...protoadapt.MessageV1) error {
	if d, err := st.WithDetails(details...); err == nil { // fails only for an OK status
		st = d
	}
	return st.Err()
}

// release gives lease back, with a deadline of its own: the call's
// context may be canceled already (the client went away).
func (in *Interceptors) release(ctx context.Context, lease sluice.Lease) {
	if lease.ID == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), in.deadline)
	defer cancel()
	if o := in.limiter.Release(ctx, lease); o.Kind != sluice.Allowed {
		in.warn(ctx, "sluice: lease not released; it is held until its lease_ttl passes",
			"policies", strings.Join(lease.Policies, ","), "subject", lease.Subject, "outcome", o.Kind.String(), "error", o.Err)
	}
}

// warn logs msg at Warn, at most once a second, with the count of the
// records held back.
func (in *Interceptors) warn(ctx context.Context, msg string, args ...any) {
	ok, suppressed := in.warnings.Allow(clock.System{}.Now())
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args, "suppressed_since_last", suppressed)
	}
	in.log.WarnContext(ctx, msg, args...)
}
