// Package chartcheck holds no code: its tests render charts/sluice with
// Helm's own engine and check the manifests as a cluster would, since CI
// has no cluster and no helm binary. It is a module of its own so that
// Helm's and the Prometheus operator's dependencies do not move the
// versions the service is built with.
package chartcheck
