package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/goep/goep/comm"
)

func zapNop() *zap.Logger { return zap.NewNop() }

func init() {
	helperActions["join"] = joinHelper
	helperActions["leave0"] = func(r int) { leaveEarly(r, func() { os.Exit(0) }) }
	helperActions["leave3"] = func(r int) { leaveEarly(r, func() { os.Exit(3) }) }
	helperActions["leavekill"] = func(r int) {
		leaveEarly(r, func() { syscall.Kill(os.Getpid(), syscall.SIGKILL); select {} })
	}
	helperActions["graceful"] = gracefulHelper
	helperActions["bystander"] = bystanderHelper
}

// stamp is a wall-clock time that other processes of the machine can
// compare with theirs.
func stamp() int64 { return time.Now().UnixNano() }

// joining says, in the ready directory, that rank is about to join (a file
// "joining-RANK").
func joining(rank int) {
	if dir := os.Getenv(readyDir); dir != "" {
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("joining-%d", rank)), nil, 0o644)
	}
}

// joinHelper is a rank that joins (its rendezvous bounded by a minute, far
// beyond what the tests allow) and reports how its join ended.
func joinHelper(rank int) {
	joining(rank)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g, _, err := Bootstrap(ctx)
	if err == nil {
		fmt.Println("joined")
		g.Close()
		return
	}
	var pe *comm.PeerLostError
	lost := "none"
	if errors.As(err, &pe) {
		lost = fmt.Sprint(pe.Ranks)
	}
	fmt.Printf("join failed at %d lost %s: %v\n", stamp(), lost, err)
	os.Exit(1)
}

// leaveEarly waits until every other rank is about to join, then says when
// it leaves and leaves (how).
func leaveEarly(rank int, how func()) {
	dir := os.Getenv(readyDir)
	n, _ := strconv.Atoi(os.Getenv("WORLD_SIZE"))
	ctx, cancel := context.WithTimeout(context.Background(), helperSleep)
	defer cancel()
	for {
		ents, _ := os.ReadDir(dir)
		k := 0
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "joining-") {
				k++
			}
		}
		if k == n-1 {
			break
		}
		select {
		case <-ctx.Done():
			os.Exit(101)
		case <-time.After(5 * time.Millisecond):
		}
	}
	fmt.Printf("leaving at %d\n", stamp())
	how()
}

var (
	leftAt   = regexp.MustCompile(`(?m)^\[rank (\d+)\] leaving at (\d+)$`)
	failedAt = regexp.MustCompile(`(?m)^\[rank (\d+)\] join failed at (\d+) lost (\S+): (.*)$`)
)

// TestSpawnEarlyExit: a rank that exits (status 0 or not) or is killed
// before it joins makes every other rank's join fail at once, each with a
// *comm.PeerLostError naming it, and Spawn's error names it too. Without
// eprun launch's news the others would wait for it until
// GOEP_RENDEZVOUS_TIMEOUT.
func TestSpawnEarlyExit(t *testing.T) {
	for _, tc := range []struct {
		action, want string
	}{
		{"leave0", "rank 2 exited with status 0"},
		{"leave3", "rank 2 exited with status 3"},
		{"leavekill", "rank 2 killed by signal 9"},
	} {
		t.Run(tc.action, func(t *testing.T) {
			err, stdout, stderr, _ := spawnHelper(t, t.Context(), SpawnConfig{N: 4, Timeout: 2 * time.Minute}, "2:"+tc.action+",*:join")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Spawn: %v, want an error saying %q", err, tc.want)
			}
			m := leftAt.FindStringSubmatch(stdout)
			if m == nil {
				t.Fatalf("rank 2 did not say when it left:\n%s\n%s", stdout, stderr)
			}
			left, _ := strconv.ParseInt(m[2], 10, 64)
			failed := failedAt.FindAllStringSubmatch(stdout, -1)
			if len(failed) != 3 {
				t.Fatalf("%d ranks' joins failed, want 3:\n%s\n%s", len(failed), stdout, stderr)
			}
			for _, f := range failed {
				at, _ := strconv.ParseInt(f[2], 10, 64)
				// Milliseconds in fact; far below GOEP_RENDEZVOUS_TIMEOUT.
				if d := time.Duration(at - left); d > 5*time.Second {
					t.Errorf("rank %s failed %v after rank 2 left", f[1], d)
				}
				if f[3] != "[2]" {
					t.Errorf("rank %s: %s, want a *comm.PeerLostError naming rank 2", f[1], f[4])
				}
			}
		})
	}
}

// readyPID waits until rank's ready file holds its pid.
func readyPIDs(t *testing.T, dir string, ranks ...int) map[int]int {
	t.Helper()
	pids := map[int]int{}
	deadline := time.Now().Add(prompt)
	for len(pids) < len(ranks) {
		for _, r := range ranks {
			b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("pid-%d", r)))
			if p, perr := strconv.Atoi(string(b)); err == nil && perr == nil {
				pids[r] = p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("ranks %v not ready after %v (pids %v)", ranks, prompt, pids)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return pids
}

// readyWithPID says that rank joined, writing its pid to "pid-RANK".
func readyWithPID(rank int) {
	dir := os.Getenv(readyDir)
	tmp := filepath.Join(dir, fmt.Sprintf(".pid-%d", rank))
	_ = os.WriteFile(tmp, []byte(strconv.Itoa(os.Getpid())), 0o644)
	_ = os.Rename(tmp, filepath.Join(dir, fmt.Sprintf("pid-%d", rank)))
}

// gracefulHelper is a rank with its own signal handling, like eprun: on
// SIGTERM its context ends, and its shutdown then waits for its peers in a
// barrier bounded by 10 s whatever the signal (as executor.Engine.Close
// does). WithAbort(ctx) makes that wait end at once.
func gracefulHelper(rank int) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	g, _, err := Bootstrap(ctx, WithAbort(ctx))
	if err != nil {
		fmt.Println("bootstrap:", err)
		os.Exit(1)
	}
	readyWithPID(rank)
	<-ctx.Done()
	start := time.Now()
	bctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = g.Barrier(bctx)
	cancel()
	fmt.Printf("shutdown barrier took %v aborted %v: %v\n", time.Since(start).Round(time.Millisecond), errors.Is(err, comm.ErrAborted), err)
	g.Close()
	os.Exit(1)
}

// bystanderHelper is a rank that gets no signal: it waits in an AllToAll
// with the others (over the peer connections, so that the others' barrier
// is not refused as a mismatched call), and reports how it ended.
func bystanderHelper(rank int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g, _, err := Bootstrap(ctx)
	if err != nil {
		fmt.Println("bootstrap:", err)
		os.Exit(1)
	}
	readyWithPID(rank)
	_, err = g.AllToAll(ctx, make([][]byte, g.Size()))
	var pe *comm.PeerLostError
	lost := "none"
	if errors.As(err, &pe) {
		lost = fmt.Sprint(pe.Ranks)
	}
	fmt.Printf("bystander lost %s: %v\n", lost, err)
	os.Exit(1)
}

var shutdownLine = regexp.MustCompile(`(?m)^\[rank (\d+)\] shutdown barrier took (\S+) aborted (\w+): (.*)$`)

// TestBootstrapAbort: SIGTERM to ranks whose shutdown waits for their
// peers (a 10 s barrier, as a graceful Close does) ends them at once when
// they bootstrapped WithAbort(their signal context): the group is aborted,
// so the barrier fails with comm.ErrAborted (or names the peer that
// aborted first) instead of waiting; the rank that got no signal learns
// that a peer stopped, and why. Exit times are measured from the signal,
// with bounds far above what they take (milliseconds) and below the 10 s
// wait.
func TestBootstrapAbort(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	type result struct {
		err            error
		stdout, stderr string
	}
	done := make(chan result, 1)
	go func() {
		err, stdout, stderr, _ := spawnHelperIn(t, ctx, SpawnConfig{N: 3, Timeout: 2 * time.Minute}, "2:bystander,*:graceful", dir)
		done <- result{err, stdout, stderr}
	}()
	pids := readyPIDs(t, dir, 0, 1, 2)
	start := time.Now()
	for _, r := range []int{0, 1} {
		if err := syscall.Kill(pids[r], syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	res := <-done
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the job ended %v after SIGTERM", d)
	}
	lines := shutdownLine.FindAllStringSubmatch(res.stdout, -1)
	if len(lines) != 2 {
		t.Fatalf("%d ranks reported their shutdown, want 2:\n%s\n%s", len(lines), res.stdout, res.stderr)
	}
	for _, l := range lines {
		took, err := time.ParseDuration(l[2])
		// Cut short by its own abort, or by its peer's, whichever
		// came first.
		if err != nil || took > 5*time.Second || (l[3] != "true" && !strings.Contains(l[4], "stopped: terminated signal received")) {
			t.Errorf("rank %s: shutdown barrier took %s, aborted %s (%s); want it cut short by an abort", l[1], l[2], l[3], l[4])
		}
	}
	if !strings.Contains(res.stdout, "bystander lost [") || !strings.Contains(res.stdout, "stopped: terminated signal received") {
		t.Errorf("the rank that got no signal does not name an interrupted rank:\n%s", res.stdout)
	}
}

// TestLauncherNews reads the launcher pipe as a rank does: its lines
// become departures, the variable is unset, and a descriptor that is not
// a pipe is refused.
func TestLauncherNews(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pw.Close()
	fd, err := syscall.Dup(int(pr.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	pr.Close()
	t.Setenv("GOEP_LAUNCHER_FD", strconv.Itoa(fd))
	news, err := launcherNews(zapNop())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := os.LookupEnv("GOEP_LAUNCHER_FD"); ok {
		t.Error("GOEP_LAUNCHER_FD still set: the rank's children would take the pipe for theirs")
	}
	fmt.Fprintf(pw, "noise\nexit x y\nexit 2 exited with status 0\nexit 5 killed by signal 9 (killed)\n")
	for _, want := range []comm.Departure{{Rank: 2, Cause: "its process exited with status 0"}, {Rank: 5, Cause: "its process killed by signal 9 (killed)"}} {
		select {
		case d := <-news:
			if d != want {
				t.Errorf("news %+v, want %+v", d, want)
			}
		case <-time.After(prompt):
			t.Fatalf("no news %+v", want)
		}
	}

	f, err := os.CreateTemp(t.TempDir(), "not-a-pipe")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	t.Setenv("GOEP_LAUNCHER_FD", strconv.Itoa(int(f.Fd())))
	if _, err := launcherNews(zapNop()); err == nil || !strings.Contains(err.Error(), "not the pipe from eprun launch") {
		t.Errorf("a regular file: %v, want an error saying it is not the launcher's pipe", err)
	}
}
