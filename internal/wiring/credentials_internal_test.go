package wiring

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/config"
)

// TestCredentialFiles: a credential file is read at start (a missing,
// empty or oversized one fails there, naming the field and the file,
// never what it holds) and read again when it changes; the other
// credential comes as given.
func TestCredentialFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "password")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rc := &config.Redis{URL: "redis://127.0.0.1:1/0", PasswordFile: path}
	for _, bad := range []struct {
		content string // "" with no file: missing
		want    string
	}{
		{"", `store.redis.password_file: "` + path + `": cannot read the credential: no such file or directory`},
		{"\n", `store.redis.password_file: "` + path + `": cannot read the credential: is empty`},
		{strings.Repeat("s", maxSecretBytes+1), `store.redis.password_file: "` + path + `": cannot read the credential: holds more than 65536 bytes`},
	} {
		if bad.content != "" {
			write(bad.content)
		}
		if _, err := NewRedisClient(rc, nil); err == nil || err.Error() != bad.want {
			t.Errorf("NewRedisClient with the file holding %d bytes: error = %v, want %s", len(bad.content), err, bad.want)
		}
	}
	write("first\r\n")
	provide, err := credentials(rc, "sluice", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if u, p, err := provide(ctx); u != "sluice" || p != "first" || err != nil {
		t.Fatalf("provide() = %q, %q, %v; want sluice, first", u, p, err)
	}
	write("second-and-longer\n")
	if u, p, err := provide(ctx); u != "sluice" || p != "second-and-longer" || err != nil {
		t.Fatalf("after the rotation provide() = %q, %q, %v; want sluice, second-and-longer", u, p, err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, _, err := provide(ctx); err == nil || strings.Contains(err.Error(), "second") {
		t.Fatalf("with the file gone provide() error = %v, want one naming the file and not the password", err)
	}
}
