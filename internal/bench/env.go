package bench

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"time"
)

// Version is goep's version, set at release time with
// -ldflags "-X github.com/goep/goep/internal/bench.Version=v1.2.3".
var Version = "0.1.0-dev"

// Env is the environment a run was measured in.
type Env struct {
	// Backend is the config's backend: "host" or "cuda".
	Backend string `json:"backend"`
	// GPU, GPUIndex and Driver describe rank 0's GPU on the cuda backend:
	// its name (device.CUDA.Name), its index (GOEP_DEVICE) and the
	// driver version as NVML reports it (empty when NVML cannot be
	// loaded).
	GPU         string `json:"gpu,omitempty"`
	GPUIndex    *int   `json:"gpu_index,omitempty"`
	Driver      string `json:"driver,omitempty"`
	GoepVersion string `json:"goep_version"`
	Commit      string `json:"commit,omitempty"`
	CommitTime  string `json:"commit_time,omitempty"`
	Modified    bool   `json:"modified,omitempty"`
	GoVersion   string `json:"go_version"`
	GOOS        string `json:"goos"`
	GOARCH      string `json:"goarch"`
	GOMAXPROCS  int    `json:"gomaxprocs"`
	NumCPU      int    `json:"num_cpu"`
	CPU         string `json:"cpu,omitempty"`
	Hostname    string `json:"hostname,omitempty"`
	// LoadAvg is the 1, 5 and 15 minute load averages at the start (Linux):
	// other work on the machine skews a CPU benchmark.
	LoadAvg string    `json:"loadavg,omitempty"`
	Start   time.Time `json:"start"`
	Args    []string  `json:"args,omitempty"`
}

// CollectEnv describes this process and machine. The commit comes from the
// binary's build info (go build stamps it); when that is absent (go run,
// go test) it asks git, if git is there, with a short deadline.
func CollectEnv(ctx context.Context) Env {
	e := Env{
		Backend:     "host",
		GoepVersion: Version,
		GoVersion:   runtime.Version(),
		GOOS:        runtime.GOOS,
		GOARCH:      runtime.GOARCH,
		GOMAXPROCS:  runtime.GOMAXPROCS(0),
		NumCPU:      runtime.NumCPU(),
		CPU:         ProcField("/proc/cpuinfo", "model name"),
		Start:       time.Now().UTC(),
	}
	e.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			e.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				e.Commit = s.Value
			case "vcs.time":
				e.CommitTime = s.Value
			case "vcs.modified":
				e.Modified = s.Value == "true"
			}
		}
	}
	if e.Commit == "" {
		e.Commit, e.Modified = gitCommit(ctx)
	}
	return e
}

// ProcField returns the value of the first "key: value" line of a /proc
// file (Linux), else "".
func ProcField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func gitCommit(ctx context.Context) (commit string, modified bool) {
	if _, err := exec.LookPath("git"); err != nil {
		return "", false
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "git", "rev-parse", "HEAD").Output()
	if err != nil {
		return "", false
	}
	st, err := exec.CommandContext(ctx, "git", "status", "--porcelain", "--untracked-files=no").Output()
	return strings.TrimSpace(string(out)), err == nil && len(strings.TrimSpace(string(st))) > 0
}
