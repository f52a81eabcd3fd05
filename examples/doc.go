// Package examples holds Sluice's examples — the rule files in config/,
// the Envoy bootstrap at the repository root (envoy.yaml) and the IAM
// policy — and the tests that keep them valid: the files must load, and
// must still do what the README says they do.
package examples
