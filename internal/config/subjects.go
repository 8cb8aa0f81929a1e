package config

import (
	"fmt"
	"strconv"

	"github.com/sluicehq/sluice/subject"
	"go.yaml.in/yaml/v3"
)

// Subjects configures how subjects are pseudonymized.
type Subjects struct {
	// HMACKeys are the pseudonymization keys, newest first; the first one
	// keys new decisions. Empty: subjects are digested without a key.
	HMACKeys []HMACKey
}

// HMACKey names one HMAC key; its secret lives in an environment variable,
// never in the file.
type HMACKey struct {
	ID        string // 1 to 16 of a-z 0-9, part of every pseudonym
	SecretEnv string // name of the environment variable holding the secret
}

// HMACKeys resolves the secrets of Subjects.HMACKeys through getenv
// (os.Getenv in production). A missing or too short secret is an *Error
// naming the environment variable.
func (c *Config) HMACKeys(getenv func(string) string) ([]subject.Key, error) {
	keys := make([]subject.Key, 0, len(c.Subjects.HMACKeys))
	for i, k := range c.Subjects.HMACKeys {
		path := fmt.Sprintf("subjects.hmac_keys[%d].secret_env", i)
		secret := getenv(k.SecretEnv)
		switch {
		case secret == "":
			return nil, c.errorAt(path, strconv.Quote(k.SecretEnv), "environment variable "+k.SecretEnv+" is not set or empty")
		case len(secret) < minSecretLen:
			return nil, c.errorAt(path, strconv.Quote(k.SecretEnv), fmt.Sprintf("environment variable %s holds %d bytes: an HMAC secret must be at least %d (32 random bytes recommended)", k.SecretEnv, len(secret), minSecretLen))
		}
		keys = append(keys, subject.Key{ID: k.ID, Secret: []byte(secret)})
	}
	return keys, nil
}

// minSecretLen is the shortest secret subject.New takes, in bytes
// (TestSecretBoundIsSubjects holds the two equal).
const minSecretLen = 16

// validKeyID reports whether subject.New takes id as a key's: the rule is
// subject's, asked of it with a secret long enough.
func validKeyID(id string) bool {
	_, err := subject.New([]subject.Key{{ID: id, Secret: make([]byte, 32)}})
	return err == nil
}

func (c *Config) validateSubjects() []*Error {
	var errs []*Error
	seen := map[string]int{}
	for i, k := range c.Subjects.HMACKeys {
		path := fmt.Sprintf("subjects.hmac_keys[%d]", i)
		switch j, dup := seen[k.ID]; {
		case !validKeyID(k.ID):
			errs = append(errs, c.errorAt(path+".id", strconv.Quote(k.ID), "must be 1 to 16 of a-z 0-9"))
		case dup:
			errs = append(errs, c.errorAt(path+".id", strconv.Quote(k.ID), fmt.Sprintf("is already the id of subjects.hmac_keys[%d]", j)))
		case !validEnvName(k.SecretEnv):
			errs = append(errs, c.errorAt(path+".secret_env", strconv.Quote(k.SecretEnv), envNameRule))
		}
		if _, dup := seen[k.ID]; !dup {
			seen[k.ID] = i
		}
	}
	return errs
}

func (d *decoder) subjects(s *Subjects, n *yaml.Node) {
	m, ok := d.mapping("subjects", n, "hmac_keys")
	if !ok {
		return
	}
	v := m["hmac_keys"]
	if v == nil {
		return
	}
	items, ok := d.sequence("subjects.hmac_keys", v)
	if !ok {
		return
	}
	s.HMACKeys = make([]HMACKey, len(items))
	for i, item := range items {
		path := fmt.Sprintf("subjects.hmac_keys[%d]", i)
		km, ok := d.mapping(path, item, "id", "secret_env")
		if !ok {
			continue
		}
		d.required(path, item, km, "id", "secret_env")
		k := &s.HMACKeys[i]
		d.str(path+".id", km["id"], &k.ID)
		d.str(path+".secret_env", km["secret_env"], &k.SecretEnv)
	}
}
