//go:build unix && !linux

package dynamodbtest

import (
	"os"
	"syscall"
)

// sysProcAttr puts the server in its own process group, so that Stop kills
// everything it started.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

func killGroup(p *os.Process) {
	if syscall.Kill(-p.Pid, syscall.SIGKILL) != nil {
		p.Kill()
	}
}
