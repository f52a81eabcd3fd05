//go:build !unix

package dynamodbtest

import (
	"os"
	"syscall"
)

func sysProcAttr() *syscall.SysProcAttr { return nil }

func killGroup(p *os.Process) { p.Kill() }
