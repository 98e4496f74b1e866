package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/goep/goep/internal/bench"
)

func newVersion(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the goep version, commit and Go version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			e := bench.CollectEnv(cmd.Context())
			commit := e.Commit
			if commit == "" {
				commit = "unknown"
			}
			if e.Modified {
				commit += " (modified)"
			}
			_, err := fmt.Fprintf(stdout, "goep %s\ncommit %s\n%s %s/%s\n", e.GoepVersion, commit, e.GoVersion, e.GOOS, e.GOARCH)
			return err
		},
	}
}
