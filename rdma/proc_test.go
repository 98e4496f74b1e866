package rdma

import (
	"os/exec"
	"testing"
)

func TestProcessAlive(t *testing.T) {
	me := self()
	if me.Host == "" || me.Start == 0 {
		t.Skipf("no /proc here: %+v", me)
	}
	if !me.sameHost(me) || !me.alive() {
		t.Fatalf("this process is not alive: %+v", me)
	}
	cmd := exec.Command("sleep", "10")
	if err := cmd.Start(); err != nil {
		t.Skip("cannot start sleep:", err)
	}
	st, err := startTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	child := process{Host: me.Host, PID: cmd.Process.Pid, Start: st}
	if !child.alive() {
		t.Fatal("child not alive")
	}
	cmd.Process.Kill()
	// A zombie until reaped counts as dead too.
	for child.alive() {
	}
	cmd.Wait()
	if child.alive() || (process{Host: me.Host, PID: me.PID, Start: me.Start + 1}).alive() {
		t.Fatal("dead or reused process reported alive")
	}
}
