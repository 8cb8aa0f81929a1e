//go:build !linux

package redistest

import "syscall"

// dieWithParent has no portable form outside Linux: a test binary that
// dies before its cleanups leaves its servers running there.
func dieWithParent() *syscall.SysProcAttr { return nil }
