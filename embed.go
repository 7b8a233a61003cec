// Package tollgate holds what the binary embeds from the repository root:
// the example configuration it runs on when no -config is given.
package tollgate

import _ "embed"

//go:embed config.example.yaml
var exampleConfig string

// ExampleConfig returns config.example.yaml as embedded at build time.
func ExampleConfig() []byte { return []byte(exampleConfig) }
