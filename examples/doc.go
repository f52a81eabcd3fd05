// Package examples holds Sluice's examples — the rule files in config/,
// the Envoy bootstrap at the repository root (envoy.yaml), the Compose
// demo, the Istio manifests, the Envoy Gateway configuration and demo,
// and the IAM policy — and the tests that keep
// them valid: the files must load as the tools that read them would load
// them, and must still do what the READMEs say they do.
package examples
