package bench

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/goep/goep/comm"
	"github.com/goep/goep/device"
)

func TestCheckBackend(t *testing.T) {
	for _, tc := range []struct {
		kind string
		want string // "" = nil; "nocuda" = ErrNoCUDA in a build without cuda
	}{
		{"", ""},
		{"host", ""},
		{"cuda", "nocuda"},
		{"tpu", `backend "tpu": want host or cuda`},
	} {
		err := CheckBackend(tc.kind)
		switch {
		case tc.want == "nocuda" && CUDACompiled:
			if err != nil {
				t.Errorf("%q: %v in a cuda build", tc.kind, err)
			}
		case tc.want == "nocuda":
			if !errors.Is(err, ErrNoCUDA) || !strings.Contains(err.Error(), "-tags cuda") {
				t.Errorf("%q: %v, want ErrNoCUDA naming -tags cuda", tc.kind, err)
			}
		case tc.want == "":
			if err != nil {
				t.Errorf("%q: %v", tc.kind, err)
			}
		case err == nil || !strings.Contains(err.Error(), tc.want):
			t.Errorf("%q: %v, want %q", tc.kind, err, tc.want)
		}
	}
}

// TestNoCUDA: without the cuda tag, every way into the cuda backend fails
// at once with ErrNoCUDA, and nothing runs.
func TestNoCUDA(t *testing.T) {
	if CUDACompiled {
		t.Skip("built with -tags cuda: the cuda backend is there")
	}
	b, err := NewBackend(BackendCUDA)
	if b != nil || !errors.Is(err, ErrNoCUDA) {
		t.Fatalf("NewBackend(cuda) = %v, %v; want ErrNoCUDA", b, err)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error is not one line: %q", err)
	}
	c := Defaults()
	c.Backend, c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens, c.Iters, c.Warmup = BackendCUDA, 2, 4, Ints{2}, Ints{8}, Ints{4}, 1, 0
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v (the backend's presence is not the config's business)", err)
	}
	if _, err := Run(t.Context(), c, Options{}); !errors.Is(err, ErrNoCUDA) {
		t.Errorf("Run: %v, want ErrNoCUDA", err)
	}
	g := comm.NewLocal(1)[0]
	defer g.Close()
	c.Ranks = 1
	if _, err := RunRank(t.Context(), c, g, Options{}); !errors.Is(err, ErrNoCUDA) {
		t.Errorf("RunRank: %v, want ErrNoCUDA", err)
	}
}

func TestBackendMismatch(t *testing.T) {
	c := Defaults()
	c.Backend, c.Ranks, c.Experts, c.TopK, c.Hidden, c.Tokens, c.Iters, c.Warmup = BackendCUDA, 1, 4, Ints{2}, Ints{8}, Ints{4}, 1, 0
	h := device.NewHost()
	defer h.Close()
	g := comm.NewLocal(1)[0]
	defer g.Close()
	_, err := RunRank(t.Context(), c, g, Options{Backend: h})
	if err == nil || !strings.Contains(err.Error(), "backend is cuda, Options.Backend is host") {
		t.Errorf("RunRank of a cuda config on a host backend: %v", err)
	}
}

func TestDeviceOrdinal(t *testing.T) {
	for _, tc := range []struct {
		env  string
		set  bool
		want int
		err  bool
	}{
		{set: false, want: 0},
		{env: "3", set: true, want: 3},
		{env: " 1 ", set: true, want: 1},
		{env: "-1", set: true, err: true},
		{env: "gpu0", set: true, err: true},
	} {
		if tc.set {
			t.Setenv("GOEP_DEVICE", tc.env)
		} else {
			t.Setenv("GOEP_DEVICE", "")
			unsetenv(t, "GOEP_DEVICE")
		}
		got, err := DeviceOrdinal()
		if (err != nil) != tc.err || (!tc.err && got != tc.want) {
			t.Errorf("GOEP_DEVICE=%q (set %v): %d, %v; want %d, error %v", tc.env, tc.set, got, err, tc.want, tc.err)
		}
		if err != nil && !strings.Contains(err.Error(), "GOEP_DEVICE") {
			t.Errorf("error %q does not name GOEP_DEVICE", err)
		}
	}
}

func TestConfigBackend(t *testing.T) {
	c, err := ParseConfig(strings.NewReader("backend: cuda\n"))
	if err != nil || c.Backend != BackendCUDA {
		t.Fatalf("backend: cuda parsed as %q, %v", c.Backend, err)
	}
	if c, _ := ParseConfig(strings.NewReader("ranks: 4\n")); c.Backend != BackendHost {
		t.Errorf("default backend %q, want host", c.Backend)
	}
	c.Backend = "tpu"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `backend "tpu"`) {
		t.Errorf("Validate of backend tpu: %v", err)
	}
}

// TestStepsCUDA: a cuda run has no a2a steps.
func TestStepsCUDA(t *testing.T) {
	c := Defaults()
	host := Options{}.Steps(c)
	c.Backend = BackendCUDA
	cuda := Options{}.Steps(c)
	per := c.Warmup + c.Iters
	if want := host - len(c.Cases())*len(c.Calls)*per; cuda != want {
		t.Errorf("cuda steps %d, want %d (host %d less the a2a's)", cuda, want, host)
	}
}

// TestWriteTableCUDA: a cuda record's table names the GPU and the timing,
// and shows the a2a columns as "-" with a line saying why.
func TestWriteTableCUDA(t *testing.T) {
	idx := 0
	c := Defaults()
	c.Backend = BackendCUDA
	rec := Record{
		Env:    Env{Backend: BackendCUDA, GPU: "NVIDIA H200", GPUIndex: &idx, Driver: "580.159.04", GoepVersion: "x"},
		Config: c, Launcher: "in-process", Processes: 1, Group: "local", Timing: TimingEventMax,
		Rows: []Row{{Call: CallDispatch, Tokens: 128, Hidden: 7168, TopK: 8, DType: "bf16",
			Time: Stats{N: 3, Median: 100, P99: 120}, NVLGBps: 50, BaselineGBps: 100, Ratio: 0.5, CheckedRows: 10}},
		CheckedRows: 10,
	}
	var b bytes.Buffer
	if err := WriteTable(&b, rec); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"backend cuda", "# gpu: NVIDIA H200 (GPU 0)  driver 580.159.04", "CUDA events",
		"device-to-device copy", "# a2a: not run on the cuda backend", "# check: OK",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == CallDispatch {
			// a2a_us a2a_GBps vs_a2a are the three columns before #wrong
			if got := strings.Join(f[len(f)-4:len(f)-1], " "); got != "- - -" {
				t.Errorf("a2a columns %q, want - - -: %s", got, l)
			}
		}
	}
}

// unsetenv removes key for the rest of the test (t.Setenv first, so that
// it is restored afterwards).
func unsetenv(t *testing.T, key string) {
	t.Helper()
	if err := os.Unsetenv(key); err != nil {
		t.Fatal(err)
	}
}
