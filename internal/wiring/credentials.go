package wiring

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/config"
)

// maxSecretBytes bounds a credential file: a password, or a cloud IAM
// token (a few KiB).
const maxSecretBytes = 64 << 10

// secretFile is a credential kept in a file (store.redis.password_file,
// username_file): read again whenever the file's size or modification
// time changed since the last read, so a rotated Secret is used by the
// next connection. Safe for concurrent use.
type secretFile struct {
	field, path string // the config field and the file, for errors

	mu    sync.Mutex
	size  int64
	mod   time.Time
	value string
}

// read returns the file's credential: the one last read while the file
// is unchanged. Its errors name the field and the file, never what the
// file holds.
func (f *secretFile) read() (string, error) {
	fi, err := os.Stat(f.path)
	if err != nil {
		return "", f.fail(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.value != "" && fi.Size() == f.size && fi.ModTime().Equal(f.mod) {
		return f.value, nil
	}
	file, err := os.Open(f.path)
	if err != nil {
		return "", f.fail(err)
	}
	defer file.Close()
	b, err := io.ReadAll(io.LimitReader(file, maxSecretBytes+1))
	switch {
	case err != nil:
		return "", f.fail(err)
	case len(b) > maxSecretBytes:
		return "", f.fail(fmt.Errorf("holds more than %d bytes", maxSecretBytes))
	}
	v := strings.TrimRight(string(b), "\r\n")
	if v == "" {
		return "", f.fail(errors.New("is empty"))
	}
	f.size, f.mod, f.value = fi.Size(), fi.ModTime(), v
	return v, nil
}

// fail is err as a config error naming f's field and file.
func (f *secretFile) fail(err error) error {
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		err = pe.Err // the path is the Value already
	}
	return &config.Error{Path: "store.redis." + f.field, Value: strconv.Quote(f.path), Rule: "cannot read the credential: " + err.Error()}
}

// credentials returns go-redis's CredentialsProviderContext for rc when
// it names a credential file, nil otherwise: the username and password
// of each new connection, read from the files as they are then (the
// others, username and password, as given). It reads the files once now,
// so a missing one fails at start.
func credentials(rc *config.Redis, username, password string) (func(context.Context) (string, string, error), error) {
	if rc.UsernameFile == "" && rc.PasswordFile == "" {
		return nil, nil
	}
	var user, pass *secretFile
	if rc.UsernameFile != "" {
		user = &secretFile{field: "username_file", path: rc.UsernameFile}
	}
	if rc.PasswordFile != "" {
		pass = &secretFile{field: "password_file", path: rc.PasswordFile}
	}
	provide := func(context.Context) (string, string, error) {
		u, p := username, password
		var err error
		if user != nil {
			if u, err = user.read(); err != nil {
				return "", "", err
			}
		}
		if pass != nil {
			if p, err = pass.read(); err != nil {
				return "", "", err
			}
		}
		return u, p, nil
	}
	if _, _, err := provide(context.Background()); err != nil {
		return nil, err
	}
	return provide, nil
}
