// Package configs holds eprun's benchmark configs as data: the YAML files
// of this directory, embedded so that the eprun binary carries them.
// "eprun bench" with no config runs default.yaml; "eprun bench NAME" runs
// NAME.yaml from here when no file of that name exists on disk.
package configs

import "embed"

// FS holds every *.yaml file of this directory.
//
//go:embed *.yaml
var FS embed.FS

// Default is the name of the config eprun bench runs by default.
const Default = "default.yaml"
