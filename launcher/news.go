package launcher

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/goep/goep/comm"
)

// launcherNews opens the pipe on which eprun launch (Spawn) tells this rank
// that another rank's process ended, named by GOEP_LAUNCHER_FD, and returns
// its news; nil when the variable is unset. The variable is then unset
// and the descriptor closed on exec, so that the rank's own children do
// not take it for theirs. A value that is not the descriptor of an open
// pipe is an error.
func launcherNews(log *zap.Logger) (<-chan comm.Departure, error) {
	s, ok := os.LookupEnv("GOEP_LAUNCHER_FD")
	if !ok {
		return nil, nil
	}
	fd, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("launcher: GOEP_LAUNCHER_FD=%q: want the descriptor (3 or more) of the pipe eprun launch gives each rank", s)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		why := "not a pipe"
		if err != nil {
			why = err.Error()
		}
		return nil, fmt.Errorf("launcher: GOEP_LAUNCHER_FD=%d: not the pipe from eprun launch (%s); it is set by eprun launch for its ranks only", fd, why)
	}
	unix.CloseOnExec(fd)
	if err := os.Unsetenv("GOEP_LAUNCHER_FD"); err != nil {
		return nil, fmt.Errorf("launcher: unset GOEP_LAUNCHER_FD: %w", err)
	}
	f := os.NewFile(uintptr(fd), "launcher pipe")
	ch := make(chan comm.Departure, 16)
	go func() {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			d, ok := parseNews(sc.Text())
			if !ok {
				log.Debug("ignored a line from the launcher", zap.String("line", sc.Text()))
				continue
			}
			select {
			case ch <- d:
			default: // nobody reads any more (the world formed), or enough news
			}
		}
	}()
	return ch, nil
}

// parseNews reads one line of the launcher pipe: "exit RANK HOW".
func parseNews(line string) (comm.Departure, bool) {
	f := strings.SplitN(line, " ", 3)
	if len(f) < 2 || f[0] != "exit" {
		return comm.Departure{}, false
	}
	r, err := strconv.Atoi(f[1])
	if err != nil || r < 0 {
		return comm.Departure{}, false
	}
	how := "ended"
	if len(f) == 3 && f[2] != "" {
		how = f[2]
	}
	return comm.Departure{Rank: r, Cause: fmt.Sprintf("its process %s", how)}, true
}
