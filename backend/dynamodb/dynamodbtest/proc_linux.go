package dynamodbtest

import (
	"os"
	"syscall"
)

// sysProcAttr puts the server in its own process group, so that Stop kills
// everything it started, and has the kernel kill it when the test binary
// dies without calling Stop (a panic, a test timeout, a SIGKILL).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

func killGroup(p *os.Process) {
	if syscall.Kill(-p.Pid, syscall.SIGKILL) != nil {
		p.Kill()
	}
}
