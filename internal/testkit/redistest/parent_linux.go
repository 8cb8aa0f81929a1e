package redistest

import "syscall"

// dieWithParent makes the kernel kill a started redis-server when the test
// process that started it dies, so a test binary that panics or is killed
// leaves no server behind (its cleanups never run then).
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
