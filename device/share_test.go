package device

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestShareAcrossProcesses maps a buffer of a child process: the child
// fills it and prints its handle; the parent checks the bytes, writes its
// own, and the child checks those before exiting 0.
func TestShareAcrossProcesses(t *testing.T) {
	if os.Getenv("GOEP_SHARE_CHILD") == "1" {
		shareChild()
		return
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run", "^TestShareAcrossProcesses$")
	cmd.Env = append(os.Environ(), "GOEP_SHARE_CHILD=1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	raw, err := hex.DecodeString(strings.TrimSpace(strings.TrimPrefix(line, "handle ")))
	if err != nil || len(raw) != ShareHandleSize {
		t.Fatalf("child printed %q", line)
	}
	h := DecodeShareHandle(raw)
	if h.PID != cmd.Process.Pid {
		t.Fatalf("handle names pid %d, child is %d", h.PID, cmd.Process.Pid)
	}
	m, err := MapShared(h)
	if err != nil {
		t.Fatal(err)
	}
	b := m.Buffer(h.Size)
	for i, v := range b.Host() {
		if v != byte(i*7) {
			t.Fatalf("byte %d is %d, the child wrote %d", i, v, byte(i*7))
		}
	}
	if err := b.CheckGuards(); err != nil {
		t.Fatalf("guards of the mapped buffer: %v", err)
	}
	for i := range b.Host() {
		b.Host()[i] = byte(i * 3)
	}
	fmt.Fprintln(stdin, "written")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	if err := m.Unmap(); err != nil {
		t.Fatal(err)
	}
	// A stale handle (the child is gone) fails cleanly.
	if _, err := MapShared(h); err == nil {
		t.Fatal("mapped the buffer of an exited process")
	}
}

func shareChild() {
	h := NewHost()
	s, _ := h.NewStream()
	b, err := s.Alloc(10000)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for i := range b.Host() {
		b.Host()[i] = byte(i * 7)
	}
	sh, err := b.Share()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var raw [ShareHandleSize]byte
	sh.Encode(raw[:])
	fmt.Printf("handle %x\n", raw)
	done := make(chan struct{})
	go func() {
		bufio.NewReader(os.Stdin).ReadString('\n')
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		fmt.Fprintln(os.Stderr, "parent never wrote")
		os.Exit(1)
	}
	for i, v := range b.Host() {
		if v != byte(i*3) {
			fmt.Fprintf(os.Stderr, "byte %d is %d, the parent wrote %d\n", i, v, byte(i*3))
			os.Exit(1)
		}
	}
	os.Exit(0)
}

func TestParseShareKind(t *testing.T) {
	for _, k := range []ShareKind{ShareIPC, ShareFD, ShareFabric} {
		if got, err := ParseShareKind(k.String()); err != nil || got != k {
			t.Errorf("ParseShareKind(%q) = %v, %v", k.String(), got, err)
		}
	}
	for _, s := range []string{"", "IPC", "posix", "fabric "} {
		if k, err := ParseShareKind(s); err == nil {
			t.Errorf("ParseShareKind(%q) = %v, want an error", s, k)
		}
	}
	if s := ShareKind(9).String(); s != "ShareKind(9)" {
		t.Errorf("ShareKind(9).String() = %q", s)
	}
}
