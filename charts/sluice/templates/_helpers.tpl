{{/* The chart's name, or nameOverride. */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's full name: the release's name alone when it already holds
the chart's, so `helm install sluice` names everything "sluice".
*/}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Every pod of the release: the servers, the sync, the hooks. */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The pods of `sluice serve`, which the Service, budget and autoscaler select. */}}
{{- define "sluice.serverSelectorLabels" -}}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/component: server
{{- end }}

{{- define "sluice.syncSelectorLabels" -}}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/component: sync
{{- end }}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sluice.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{- define "sluice.rulesConfigMap" -}}
{{- default (printf "%s-rules" (include "sluice.fullname" .)) .Values.rules.existingConfigMap }}
{{- end }}

{{/*
The mistakes a rate limiter must not be deployed with, refused at render
time with the reason.
*/}}
{{- define "sluice.validate" -}}
{{- $v := .Values }}
{{- if and (eq $v.backend "memory") (gt (int $v.replicaCount) 1) }}
{{- fail (printf "backend memory with replicaCount %d: each replica keeps its own buckets, so each would enforce the whole limit and clients would get %d times it; use backend redis or dynamodb to run more than one replica" (int $v.replicaCount) (int $v.replicaCount)) }}
{{- end }}
{{- if and (eq $v.backend "memory") $v.autoscaling.enabled }}
{{- fail "backend memory with autoscaling.enabled: each replica keeps its own buckets, so each replica the autoscaler adds would enforce the whole limit again; use backend redis or dynamodb to autoscale" }}
{{- end }}
{{- if and (eq $v.backend "redis") (not $v.redis.url) }}
{{- fail "backend redis needs redis.url" }}
{{- end }}
{{- if and (eq $v.backend "dynamodb") (not $v.dynamodb.table) }}
{{- fail "backend dynamodb needs dynamodb.table" }}
{{- end }}
{{- if and $v.dynamodb.createTable.enabled (ne $v.backend "dynamodb") }}
{{- fail "dynamodb.createTable.enabled needs backend dynamodb" }}
{{- end }}
{{- if and $v.rules.xds.enabled (not $v.rules.xds.server) }}
{{- fail "rules.xds.enabled needs rules.xds.server (host:port)" }}
{{- end }}
{{- if and $v.rules.xds.enabled (or $v.rules.files $v.rules.existingConfigMap) }}
{{- fail "rules.xds.enabled takes the rules from the xDS server: leave rules.files and rules.existingConfigMap empty" }}
{{- end }}
{{- if and $v.rules.files $v.rules.existingConfigMap }}
{{- fail "rules.files and rules.existingConfigMap: give the rules one way" }}
{{- end }}
{{- if and $v.regions.region (not $v.regions.all) }}
{{- fail "regions.region needs regions.all, every region and its weight" }}
{{- end }}
{{- $names := list }}
{{- range $v.regions.all }}
{{- $names = append $names .name }}
{{- end }}
{{- if and $v.regions.region (not (has $v.regions.region $names)) }}
{{- fail (printf "regions.region %s is not one of regions.all (%s)" $v.regions.region (join ", " $names)) }}
{{- end }}
{{- range $v.regions.sync.stores }}
{{- if or (eq .name $v.regions.region) (not (has .name $names)) }}
{{- fail (printf "regions.sync.stores: %s must be another region of regions.all (%s) than this one (%s)" .name (join ", " $names) $v.regions.region) }}
{{- end }}
{{- end }}
{{- if $v.regions.sync.enabled }}
{{- if eq $v.backend "memory" }}
{{- fail "regions.sync.enabled: the memory backend has no store to share records through (it enforces each region's base); use redis or dynamodb" }}
{{- end }}
{{- if not $v.regions.region }}
{{- fail "regions.sync.enabled needs regions.region" }}
{{- end }}
{{- if ne (len $v.regions.sync.stores) (sub (len $v.regions.all) 1) }}
{{- fail (printf "regions.sync.stores: the sync reads every other region's store, so it needs %d (one for each region of regions.all but %s), not %d" (sub (len $v.regions.all) 1) $v.regions.region (len $v.regions.sync.stores)) }}
{{- end }}
{{- end }}
{{- if le (int $v.terminationGracePeriodSeconds) (add $v.preStopSleepSeconds $v.shutdownTimeoutSeconds) }}
{{- fail (printf "terminationGracePeriodSeconds %d must be above preStopSleepSeconds + shutdownTimeoutSeconds (%d): otherwise the kubelet kills the pod while calls still drain" (int $v.terminationGracePeriodSeconds) (add $v.preStopSleepSeconds $v.shutdownTimeoutSeconds)) }}
{{- end }}
{{- if ne (empty $v.redis.tls.certKey) (empty $v.redis.tls.keyKey) }}
{{- fail "redis.tls.certKey and redis.tls.keyKey go together: a client certificate needs its key" }}
{{- end }}
{{- if and $v.tls.clientCA (not $v.tls.existingSecret) }}
{{- fail "tls.clientCA needs tls.existingSecret, whose ca.crt signs the client certificates" }}
{{- end }}
{{- if and $v.monitoring.serviceMonitor.enabled $v.monitoring.podMonitor.enabled }}
{{- fail "monitoring.serviceMonitor and monitoring.podMonitor: enable one, or every server is scraped twice" }}
{{- end }}
{{- if and $v.autoscaling.enabled (gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) }}
{{- fail "autoscaling.minReplicas is above autoscaling.maxReplicas" }}
{{- end }}
{{- end }}

{{/*
The store flags `sluice serve` and `sluice sync` share: the backend's
address, its password file and TLS files, the key prefix.
*/}}
{{- define "sluice.storeArgs" -}}
{{- $v := .Values }}
- --backend={{ $v.backend }}
{{- if eq $v.backend "redis" }}
- --redis-url={{ $v.redis.url }}
{{- if $v.redis.existingSecret }}
- --redis-password-file=/etc/sluice/redis-password/password
{{- end }}
{{- with $v.redis.tls }}
{{- if .existingSecret }}
{{- if .caKey }}
- --redis-tls-ca=/etc/sluice/redis-tls/{{ .caKey }}
{{- end }}
{{- if .certKey }}
- --redis-tls-cert=/etc/sluice/redis-tls/{{ .certKey }}
- --redis-tls-key=/etc/sluice/redis-tls/{{ .keyKey }}
{{- end }}
{{- end }}
{{- if .skipHostnameVerification }}
- --redis-tls-skip-hostname-verification
{{- end }}
{{- end }}
{{- end }}
{{- if eq $v.backend "dynamodb" }}
- --table={{ $v.dynamodb.table }}
{{- with $v.dynamodb.region }}
- --region={{ . }}
{{- end }}
{{- with $v.dynamodb.endpoint }}
- --endpoint={{ . }}
{{- end }}
{{- end }}
{{- with $v.keyPrefix }}
- --key-prefix={{ . }}
{{- end }}
{{- end }}

{{/* The --global-* flags every replica and the sync must agree on. */}}
{{- define "sluice.regionArgs" -}}
{{- $v := .Values.regions }}
{{- with $v.region }}
- --global-region={{ . }}
{{- end }}
{{- if $v.all }}
{{- $all := list }}
{{- range $v.all }}
{{- $all = append $all (printf "%s=%d" .name (int .weight)) }}
{{- end }}
- --global-regions={{ join "," $all }}
{{- end }}
{{- with $v.window }}
- --global-window={{ . }}
{{- end }}
{{- with $v.skew }}
- --global-skew={{ . }}
{{- end }}
{{- with $v.hold }}
- --global-hold={{ . }}
{{- end }}
{{- end }}

{{/* The volumes of the store's secrets, for the servers and the sync. */}}
{{- define "sluice.storeVolumes" -}}
{{- if and (eq .Values.backend "redis") .Values.redis.existingSecret }}
- name: redis-password
  secret:
    secretName: {{ .Values.redis.existingSecret }}
    items:
      - key: {{ .Values.redis.existingSecretPasswordKey }}
        path: password
{{- end }}
{{- if and (eq .Values.backend "redis") .Values.redis.tls.existingSecret }}
- name: redis-tls
  secret:
    secretName: {{ .Values.redis.tls.existingSecret }}
{{- end }}
{{- end }}

{{- define "sluice.storeVolumeMounts" -}}
{{- if and (eq .Values.backend "redis") .Values.redis.existingSecret }}
- name: redis-password
  mountPath: /etc/sluice/redis-password
  readOnly: true
{{- end }}
{{- if and (eq .Values.backend "redis") .Values.redis.tls.existingSecret }}
- name: redis-tls
  mountPath: /etc/sluice/redis-tls
  readOnly: true
{{- end }}
{{- end }}

{{/*
The TCP ports a store URL is reached on, as a JSON list: 443 for DynamoDB
(and STS), a Redis URL's port (6379 when it has none) and those of its
Cluster seeds (?addr=host:port), none for a unix socket. Sentinel's data
nodes are not in the URL: give networkPolicy.storePorts for them.
*/}}
{{- define "sluice.storePorts" -}}
{{- $ports := list }}
{{- if hasPrefix "dynamodb://" . }}
{{- $ports = list 443 }}
{{- else if not (hasPrefix "unix://" .) }}
{{- $u := urlParse . }}
{{- $hosts := list $u.host }}
{{- range splitList "&" $u.query }}
{{- if hasPrefix "addr=" . }}
{{- $hosts = append $hosts (trimPrefix "addr=" .) }}
{{- end }}
{{- end }}
{{- range $hosts }}
{{- $ports = append $ports (splitList ":" . | rest | first | default "6379" | int) }}
{{- end }}
{{- end }}
{{- toJson $ports }}
{{- end }}
