package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestLogLevelFromEnv(t *testing.T) {
	for _, tc := range []struct {
		level   string
		wantErr bool
		logsAt  string // a level that must reach the output
		quietAt string // a level that must not
	}{
		{"", false, "warn", "info"},
		{"debug", false, "debug", ""},
		{"error", false, "error", "warn"},
		{"loud", true, "", ""},
		{"fatal", true, "", ""},
	} {
		t.Run(tc.level, func(t *testing.T) {
			t.Setenv("GOEP_LOG_LEVEL", tc.level)
			var buf bytes.Buffer
			log, err := newLogger(&buf)
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), "GOEP_LOG_LEVEL") {
					t.Fatalf("error %v, want one naming GOEP_LOG_LEVEL", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			switch tc.logsAt {
			case "debug":
				log.Debug("shown")
			case "warn":
				log.Warn("shown")
			case "error":
				log.Error("shown")
			}
			switch tc.quietAt {
			case "info":
				log.Info("hidden")
			case "warn":
				log.Warn("hidden")
			}
			if out := buf.String(); !strings.Contains(out, "shown") || strings.Contains(out, "hidden") {
				t.Fatalf("level %q logged %q", tc.level, out)
			}
		})
	}
}
