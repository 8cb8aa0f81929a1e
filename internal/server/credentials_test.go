package server_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testkit/redistest"
)

// TestRedisPasswordRotatedInFile: a server whose Redis password comes
// from a file (store.redis.password_file, a mounted Secret) uses a
// password rotated there without a restart. The ACL user's password is
// changed on Redis (the old one removed), the file rewritten and every
// connection of the user killed: checks succeed again once the client
// has redialled with the password it reads from the file.
func TestRedisPasswordRotatedInFile(t *testing.T) {
	a := redistest.ACL(t, "sluice:")
	admin := a.AdminClient()
	t.Cleanup(func() { admin.Close() })
	secret := filepath.Join(t.TempDir(), "redis-password")
	if err := os.WriteFile(secret, []byte(a.Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	url := startOverrideServer(t, overridesConfig(fmt.Sprintf("store: { type: redis, redis: { url: \"redis://%s/0\", username: %s, password_file: %q } }", a.Addr, a.Username, secret)))
	if got := spend(t, url, "tenant", 1); !got.Allowed {
		t.Fatalf("check with the first password: %+v, want allowed", got)
	}
	ctx := context.Background()
	const rotated = "rotated-password-0123456789"
	if err := admin.Do(ctx, "acl", "setuser", a.Username, "resetpass", ">"+rotated).Err(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secret, []byte(rotated+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "client", "kill", "user", a.Username).Err(); err != nil {
		t.Fatal(err)
	}
	var last string
	waitUntil(t, "a check allowed on the rotated password", func() bool {
		code, body := call(t, "POST", url+"/v1/check", ovrCheckToken, `{"policy":"api","subject":"tenant","cost":1}`)
		last = fmt.Sprint(code, " ", body)
		return code == 200
	})
	// The check went through a connection opened after the kill, which
	// only the rotated password opens now.
	old := redis.NewClient(&redis.Options{Addr: a.Addr, Username: a.Username, Password: a.Password})
	defer old.Close()
	if err := old.Ping(ctx).Err(); err == nil {
		t.Fatalf("the first password still opens a connection: the rotation did not happen (last check: %s)", last)
	}
}
