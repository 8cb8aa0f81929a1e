//go:build unix

package redistest

import "syscall"

const (
	sigStop = syscall.SIGSTOP
	sigCont = syscall.SIGCONT
)
