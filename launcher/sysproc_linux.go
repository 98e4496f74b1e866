package launcher

import "syscall"

// sysProcAttr puts a rank in its own process group, and has the kernel kill
// it if the thread that started it (locked by Spawn until the end) dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
