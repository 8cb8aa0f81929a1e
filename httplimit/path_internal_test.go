package httplimit

import "testing"

func TestHasPathPrefix(t *testing.T) {
	for _, tt := range []struct {
		path, prefix string
		want         bool
	}{
		{"/api", "/api", true},
		{"/api/users", "/api", true},
		{"/apikeys", "/api", false},
		{"/", "/api", false},
		{"/v1/api", "/api", false},
	} {
		if got := hasPathPrefix(tt.path, tt.prefix); got != tt.want {
			t.Errorf("hasPathPrefix(%q, %q) = %v, want %v", tt.path, tt.prefix, got, tt.want)
		}
	}
}
