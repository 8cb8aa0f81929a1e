package checkapi

import (
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/checkpb"
)

// The check API over gRPC (proto/sluice/v1/check.proto) carries the same
// Request and Answer as protobuf messages, field for field and by the
// same names: FromProto reads a request, ToProto writes an answer
// as AppendAnswer writes its JSON.

// FromProto returns the Request pb carries, its id left out (the answer
// echoes it; it takes no part in the decision).
func FromProto(pb *checkpb.CheckRequest) Request {
	return Request{
		Policy: pb.Policy, Policies: pb.Policies, Subject: pb.Subject, Cost: pb.Cost,
		Refund: pb.Refund, Reset: pb.Reset_, EvaluationID: pb.EvaluationId, LeaseID: pb.LeaseId,
		Op: pb.Op, Priority: pb.Priority, MaxWaitMS: pb.MaxWaitMs,
	}
}

// ToProto returns the answer to the request id: o's, with reason as its
// reason, answered with HTTP status code: what AppendAnswer writes as
// JSON, as a CheckResponse.
func ToProto(id string, code int, o *sluice.Outcome, reason string) *checkpb.CheckResponse {
	st := &o.Status
	r := &checkpb.CheckResponse{
		Id: id, HttpStatus: int32(code), Outcome: o.Kind.String(),
		Allowed: st.Allowed, Limit: st.Limit, Remaining: st.Remaining,
		ResetAfterMs: ceilMS(st.ResetAfter), RetryAfterMs: ceilMS(st.RetryAfter), Approximate: st.Approximate,
		DelayMs: ceilMS(st.Delay), Charged: st.Charged, GivenBack: st.GivenBack, Owed: st.Owed,
		Reason: reason, Replayed: o.Replayed, Local: o.Local, LeaseId: o.Lease.ID,
	}
	if o.Cause != 0 {
		r.Cause = o.Cause.String()
	}
	if len(o.Statuses) == 0 {
		return r
	}
	r.Statuses = make([]*checkpb.Status, len(o.Statuses))
	for i := range o.Statuses {
		st := &o.Statuses[i]
		kind := sluice.Denied
		if st.Allowed {
			kind = sluice.Allowed
		}
		r.Statuses[i] = &checkpb.Status{
			Policy: st.Policy, Outcome: kind.String(),
			Allowed: st.Allowed, Limit: st.Limit, Remaining: st.Remaining,
			ResetAfterMs: ceilMS(st.ResetAfter), RetryAfterMs: ceilMS(st.RetryAfter), Approximate: st.Approximate,
			DelayMs: ceilMS(st.Delay), Charged: st.Charged, GivenBack: st.GivenBack, Owed: st.Owed,
		}
	}
	return r
}
