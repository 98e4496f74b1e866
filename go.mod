module github.com/goep/goep

go 1.26.0

require (
	github.com/NVIDIA/go-nvml v0.13.4-1
	github.com/spf13/cobra v1.10.2
	go.uber.org/zap v1.28.0
	go.yaml.in/yaml/v3 v3.0.6
	golang.org/x/sync v0.25.0
	golang.org/x/sys v0.50.0
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	go.uber.org/multierr v1.10.0 // indirect
)
