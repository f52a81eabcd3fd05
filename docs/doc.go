// Package docs holds Sluice's reference manual, the Markdown files beside
// this one that the README links to, and the test that keeps their links
// whole. The tests that tie the manual to the code (every flag of every
// command, every metric) live with that code, in cmd/sluice and examples.
package docs
