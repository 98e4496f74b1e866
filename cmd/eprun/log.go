package main

import (
	"fmt"
	"io"
	"os"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// newLogger builds eprun's logger from GOEP_LOG_LEVEL (debug, info, warn,
// error; default warn): human-readable lines on stderr. An invalid level is
// an error, never a silent default.
func newLogger(stderr io.Writer) (*zap.Logger, error) {
	level := zapcore.WarnLevel
	if v, ok := os.LookupEnv("GOEP_LOG_LEVEL"); ok && v != "" {
		if err := level.UnmarshalText([]byte(v)); err != nil || level < zapcore.DebugLevel || level > zapcore.ErrorLevel {
			return nil, fmt.Errorf("GOEP_LOG_LEVEL=%q: want debug, info, warn or error", v)
		}
	}
	enc := zap.NewDevelopmentEncoderConfig()
	enc.TimeKey = ""
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.AddSync(stderr), level)
	return zap.New(core), nil
}
