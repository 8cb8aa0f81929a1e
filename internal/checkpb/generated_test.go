package checkpb_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/sluicehq/sluice/internal/checkpb"
)

// protoDir is proto/ from this package's folder; the file is under it.
const (
	protoDir  = "../../proto"
	protoFile = "sluice/v1/check.proto"
)

// protoc returns protoc's path, or skips the test saying how to get it.
func protoc(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("protoc")
	if err != nil {
		t.Skip("protoc not found: install protobuf-compiler (make deps does) to hold internal/checkpb to proto/sluice/v1/check.proto")
	}
	return p
}

// TestGeneratedDescriptor holds the descriptor compiled into the
// generated code to the one protoc parses from the .proto: every
// message, field, number, service and method alike. A .proto edited
// without `make proto` fails here.
func TestGeneratedDescriptor(t *testing.T) {
	out := filepath.Join(t.TempDir(), "set.pb")
	cmd := exec.Command(protoc(t), "-I", protoDir, "--descriptor_set_out="+out, protoFile)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("protoc: %v\n%s", err, msg)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(raw, &set); err != nil {
		t.Fatal(err)
	}
	if len(set.File) != 1 {
		t.Fatalf("protoc described %d files, want 1", len(set.File))
	}
	got := protodesc.ToFileDescriptorProto(checkpb.File_sluice_v1_check_proto)
	if want := set.File[0]; !proto.Equal(got, want) {
		t.Errorf("internal/checkpb's descriptor differs from %s: run make proto\ngenerated:\n%s\nparsed:\n%s", protoFile, prototext.Format(got), prototext.Format(want))
	}
}

// TestGenerated regenerates check.pb.go with protoc and protoc-gen-go at
// go.mod's version and compares it with the committed one, byte for byte
// but for the line naming protoc's version. check_grpc.pb.go's generator
// is not a dependency of the module; its service is held by
// TestGeneratedDescriptor.
func TestGenerated(t *testing.T) {
	pc := protoc(t)
	dir := t.TempDir()
	plugin := filepath.Join(dir, "protoc-gen-go")
	build := exec.Command("go", "build", "-o", plugin, "google.golang.org/protobuf/cmd/protoc-gen-go")
	if msg, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build protoc-gen-go: %v\n%s", err, msg)
	}
	gen := exec.Command(pc, "-I", protoDir, "--plugin=protoc-gen-go="+plugin, "--go_out="+dir, "--go_opt=paths=source_relative", protoFile)
	if msg, err := gen.CombinedOutput(); err != nil {
		t.Fatalf("protoc: %v\n%s", err, msg)
	}
	fresh, err := os.ReadFile(filepath.Join(dir, "sluice/v1/check.pb.go"))
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile("check.pb.go")
	if err != nil {
		t.Fatal(err)
	}
	version := regexp.MustCompile(`(?m)^// \tprotoc +v.*$`)
	fresh, committed = version.ReplaceAll(fresh, nil), version.ReplaceAll(committed, nil)
	if !bytes.Equal(fresh, committed) {
		t.Errorf("internal/checkpb/check.pb.go differs from what protoc generates from %s: run make proto", protoFile)
	}
}
