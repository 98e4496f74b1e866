package comm

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// DurationFromEnv reads the environment variable name as a Go duration
// ("30s", "2m") or a number of seconds ("45", "0.5"), or returns def when it
// is unset or empty. A value that is neither, or not positive, is an error
// naming the variable, never a silent default. (GOEP_TIMEOUT and
// GOEP_RENDEZVOUS_TIMEOUT are read this way.)
func DurationFromEnv(name string, def time.Duration) (time.Duration, error) {
	v, ok := os.LookupEnv(name)
	if !ok || v == "" {
		return def, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d, nil
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s > 0 && s*float64(time.Second) < float64(1<<63-1) {
		if d := time.Duration(s * float64(time.Second)); d > 0 { // not below a nanosecond
			return d, nil
		}
	}
	return 0, fmt.Errorf("%s=%q: want a positive duration such as 30s or a number of seconds", name, v)
}
