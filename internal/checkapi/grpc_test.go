package checkapi

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/checkpb"
)

// flat returns the JSON object raw as a map whose values are their
// text ("3", "true", "denied"), nested objects in lists flattened
// alike, zero values ("0", "false", "", empty lists) left out: the
// form in which encoding/json's and protojson's spellings of one answer
// compare equal (protojson writes an int64 as a string, and both leave
// out what the other writes as zero).
func flat(t *testing.T, raw []byte) map[string]any {
	t.Helper()
	var m map[string]any
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	return flatten(m)
}

func flatten(m map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		switch v := v.(type) {
		case []any:
			var list []any
			for _, e := range v {
				if obj, ok := e.(map[string]any); ok {
					list = append(list, flatten(obj))
				} else {
					list = append(list, fmt.Sprint(e))
				}
			}
			if len(list) > 0 {
				out[k] = list
			}
		default:
			if s := fmt.Sprint(v); s != "0" && s != "false" && s != "" && s != "<nil>" {
				out[k] = s
			}
		}
	}
	return out
}

var protoNames = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

// TestToProtoIsTheAnswer: for an answer of every shape, the CheckResponse
// ToProto writes has the JSON answer's fields, by the same names, with
// the same values, and the id and HTTP status it was given.
func TestToProtoIsTheAnswer(t *testing.T) {
	settled := sluice.Status{Policy: "tokens", Allowed: true, Limit: 100, Remaining: 40, ResetAfter: time.Minute, Charged: 30, GivenBack: 20, Owed: 5}
	cases := append(outcomes[:len(outcomes):len(outcomes)], struct {
		name   string
		o      sluice.Outcome
		reason string
	}{"settled", sluice.Outcome{Kind: sluice.Allowed, Status: settled, Statuses: []sluice.Status{settled, demo}}, ""})
	for _, tc := range cases {
		code := StatusCode(&tc.o)
		pb := ToProto("id-"+tc.name, code, &tc.o, tc.reason)
		if pb.Id != "id-"+tc.name || pb.HttpStatus != int32(code) {
			t.Errorf("%s: ToProto id, http_status = %q, %d; want %q, %d", tc.name, pb.Id, pb.HttpStatus, "id-"+tc.name, code)
		}
		pb.Id, pb.HttpStatus = "", 0
		raw, err := protoNames.Marshal(pb)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(flat(t, AppendAnswer(nil, &tc.o, tc.reason)), flat(t, raw)); diff != "" {
			t.Errorf("%s: ToProto differs from AppendAnswer (-json +proto):\n%s", tc.name, diff)
		}
	}
}

// TestFromProtoIsTheRequest: a CheckRequest with every field set reads
// as the Request whose JSON has those fields, by the same names.
func TestFromProtoIsTheRequest(t *testing.T) {
	cost, wait := int64(7), int64(250)
	pb := &checkpb.CheckRequest{
		Id: "x", Policy: "p", Policies: []string{"a", "b"}, Subject: "s", Cost: &cost, Refund: true, Reset_: true,
		EvaluationId: "e", LeaseId: "l", Op: "book", Priority: "sheddable", MaxWaitMs: &wait,
	}
	// Every field of the message is set, so none is left untested.
	fields := pb.ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		if f := fields.Get(i); !pb.ProtoReflect().Has(f) {
			t.Fatalf("test request leaves %s unset", f.Name())
		}
	}
	raw, err := protoNames.Marshal(pb)
	if err != nil {
		t.Fatal(err)
	}
	want := flat(t, raw)
	delete(want, "id")
	js, err := json.Marshal(FromProto(pb))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, flat(t, js)); diff != "" {
		t.Errorf("FromProto differs from the CheckRequest (-proto +json):\n%s", diff)
	}
	zero := int64(0)
	if got := FromProto(&checkpb.CheckRequest{Cost: &zero}); got.Cost == nil || *got.Cost != 0 {
		t.Errorf("FromProto(cost: 0).Cost = %v, want an explicit 0 (a peek)", got.Cost)
	}
	if got := FromProto(&checkpb.CheckRequest{}); got.Cost != nil || got.MaxWaitMS != nil {
		t.Errorf("FromProto(no cost, no max_wait_ms) = cost %v, max_wait_ms %v; want both absent", got.Cost, got.MaxWaitMS)
	}
}

// TestProtoFieldsAreTheJSONFields: the messages of
// proto/sluice/v1/check.proto have exactly the JSON fields of Request,
// Answer and Status (their Verdict's included), by name, plus the
// request's id and the answer's id and http_status.
func TestProtoFieldsAreTheJSONFields(t *testing.T) {
	for _, tc := range []struct {
		msg   proto.Message
		json  any
		extra []string
	}{
		{&checkpb.CheckRequest{}, Request{}, []string{"id"}},
		{&checkpb.CheckResponse{}, Answer{}, []string{"id", "http_status"}},
		{&checkpb.Status{}, Status{}, nil},
	} {
		want := append(jsonNames(reflect.TypeOf(tc.json)), tc.extra...)
		var got []string
		fields := tc.msg.ProtoReflect().Descriptor().Fields()
		for i := range fields.Len() {
			got = append(got, string(fields.Get(i).Name()))
		}
		slices.Sort(want)
		slices.Sort(got)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s's fields differ from %T's JSON fields (-json +proto):\n%s", tc.msg.ProtoReflect().Descriptor().FullName(), tc.json, diff)
		}
	}
}

// jsonNames returns the JSON names of typ's fields, embedded structs'
// included.
func jsonNames(typ reflect.Type) []string {
	var names []string
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Anonymous {
			names = append(names, jsonNames(f.Type)...)
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		names = append(names, name)
	}
	return names
}
