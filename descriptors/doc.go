/*
Package descriptors is Sluice's mapping config: it loads a directory of YAML
files, validates them, keeps them up to date, and maps each request
descriptor of Envoy's rate-limit API onto a rule and a bucket identity.

The format is a superset of envoyproxy/ratelimit's: a config file of that
service loads unchanged and selects the same rule for the same descriptor.

# Files and domains

Each *.yaml or *.yml file of the directory holds one domain:

	domain: api
	descriptors:
	  - key: api_key
	    limits:
	      - {name: rpm, rate: 100/min, cost: request}
	      - {name: tpm, rate: 40000/min, burst: 60000}
	    descriptors:
	      - key: model
	        value: "gpt-*"
	        share_threshold: true
	        rate_limit: {unit: minute, requests_per_unit: 10, name: per_model}
	        resource: "chat:{model}"

Names starting with "." are skipped, and symlinks are followed, so the
"..data" layout of a Kubernetes ConfigMap volume loads as the files it
exposes. A domain may be defined by one file only.

# Rules

Every descriptor node is a Rule. A node matches one entry (key, value) of a
request descriptor: a node with a value matches that value exactly, a value
with '*' is a wildcard ('*' matches any run of characters, anywhere in the
value), and a node without a value matches any value of its key. Children
(descriptors) match the following entries.

A node's limits are its envoyproxy `rate_limit` (one limit, named
rate_limit.name or "default") followed by its Sluice `limits`, each a token
bucket with a rate, a burst (the ceiling, by default the rate amount) and a
cost (the request's hits, or one per request). A node may have no limits: a
request that ends there is matched and limited by nothing. `unlimited`,
`shadow_mode`, `replaces` and `detailed_metric` are carried on the Rule for
the caller to apply.

# Matching

Config.Match walks the request descriptor entry by entry from the domain's
top level. At each level it takes the node with the entry's exact key and
value, else the first wildcard node of the key (in file order) that matches
the value, else the key's node without a value. No node, or a node without
children while entries remain, is no match: as in envoyproxy/ratelimit a rule
applies only to a request whose last entry ends at it, never to a longer
request, and a request that ends at an intermediate node matches that node. Exact and bare lookups are map reads and
do not allocate; wildcards are compiled at load time.

A descriptor that carries its own limit (Envoy's limit override) is not
matched against the file: like envoyproxy/ratelimit, Sluice applies the
override to a bucket of its own.

# Bucket identity

A match names the bucket it charges by entity and resource. By default the
resource is the rule's Path (the domain, then "/key=value", "/key=pattern"
or "/key" per level) and the entity is the request values of the levels
matched by a bare key or a wildcard, joined with "/" and escaped so that
different value lists never collide ("_global_" when every level matched an
exact value). That is envoyproxy/ratelimit's counter identity: one bucket
per distinct key/value path. A wildcard level with share_threshold keeps its
value out of the entity, so every value it matches shares one bucket. An
empty value (a header present but empty) is a value like any other: a name
that would be empty is "%empty", so such a request is limited, in a bucket of
its own.

The `entity`, `resource` and `parent` templates of the matched node replace
these defaults; "{key}" stands for the request value of the entry with that
key, which must sit at exactly one level of the node's path. A parent names
a second bucket that is charged together with the first (cascade).

# Loading and reloading

Load and Parse report every problem at once, each as "file:line: message":
unknown keys, wrong types, duplicates, bad rates or units, invalid templates.
A Config is immutable and safe for concurrent use. Watch keeps the current
Config of a directory: it reloads on file events and, as a safety net, on a
periodic content check; a reload swaps the Config atomically, and a reload
that fails keeps the previous one in force, logs and counts the failure. A
reload that finds no rule file at all fails too: an emptied directory is a
replacement half done far more often than a wish to drop every rule.
*/
package descriptors
