{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "sssd-drafter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name; the release name when it already contains the chart name. */}}
{{- define "sssd-drafter.fullname" -}}
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

{{/* The headless Service (client-side load balancing; the StatefulSet's serviceName). */}}
{{- define "sssd-drafter.headlessName" -}}
{{- printf "%s-headless" (include "sssd-drafter.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{- define "sssd-drafter.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Standard labels on every object. */}}
{{- define "sssd-drafter.labels" -}}
helm.sh/chart: {{ include "sssd-drafter.chart" . }}
{{ include "sssd-drafter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sssd
{{- end }}

{{- define "sssd-drafter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sssd-drafter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: drafter
{{- end }}

{{- define "sssd-drafter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sssd-drafter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sssd-drafter.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* The Secret holding the admin token, and its key. */}}
{{- define "sssd-drafter.adminSecretName" -}}
{{- default (printf "%s-admin" (include "sssd-drafter.fullname" .)) .Values.admin.existingSecret }}
{{- end }}

{{- define "sssd-drafter.adminSecretKey" -}}
{{- if .Values.admin.existingSecret }}{{ .Values.admin.existingSecretKey }}{{ else }}admin-token{{ end }}
{{- end }}

{{/*
Where the gRPC credentials are mounted (the ConfigMap's DRAFTER_*_FILE paths point inside).
*/}}
{{- define "sssd-drafter.grpcTokensDir" -}}/var/run/secrets/sssd-drafter-grpc{{- end }}
{{- define "sssd-drafter.tlsDir" -}}/var/run/secrets/sssd-drafter-tls{{- end }}

{{/* The kubernetes.io/tls Secret: tls.secretName, else the one the Certificate writes. */}}
{{- define "sssd-drafter.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "sssd-drafter.fullname" .)) .Values.tls.secretName }}
{{- end }}

{{/*
A probe's check that the datastores are loaded and the pod is not stopping (.root: the
chart's context; .service: the gRPC health service, empty for the server as a whole).
Kubernetes' gRPC probe speaks plaintext only, so with TLS on the gRPC port the admin
port's /readyz answers instead: 200 exactly when gRPC health says SERVING.
*/}}
{{- define "sssd-drafter.servingCheck" -}}
{{- if .root.Values.tls.enabled }}
httpGet:
  path: /readyz
  port: admin
{{- else }}
grpc:
  port: {{ .root.Values.ports.grpc }}
  {{- with .service }}
  service: {{ . }}
  {{- end }}
{{- end }}
{{- end }}

{{/*
A setting as an environment value. Helm reads every number in values as a float64, which
prints 512000000 as 5.12e+08; whole numbers are printed as integers instead.
*/}}
{{- define "sssd-drafter.envValue" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) }}
{{- printf "%.0f" . }}
{{- else }}
{{- toString . }}
{{- end }}
{{- end }}

{{/*
The drafter's memory bound, in bytes (0: none): settings.max_resident_bytes, else
datastore.expectedBytes.
*/}}
{{- define "sssd-drafter.maxResidentBytes" -}}
{{- $set := .Values.settings.max_resident_bytes }}
{{- if $set }}{{ include "sssd-drafter.envValue" $set }}
{{- else }}{{ include "sssd-drafter.envValue" (float64 .Values.datastore.expectedBytes) }}
{{- end }}
{{- end }}

{{/*
The request states' memory bound, in bytes: settings.max_request_state_bytes, else
datastore.requestStateBytes. Always passed to the drafter (its own default, 4 GiB, would
exceed what the pod is sized for).
*/}}
{{- define "sssd-drafter.requestStateBytes" -}}
{{- $set := .Values.settings.max_request_state_bytes }}
{{- if $set }}{{ include "sssd-drafter.envValue" $set }}
{{- else }}{{ include "sssd-drafter.envValue" (float64 .Values.datastore.requestStateBytes) }}
{{- end }}
{{- end }}

{{/*
Memory request and limit of the drafter container, in MiB:

  memory = baseMemoryBytes + R + D + rebuildHeadroomFactor * min(D, S)

  R = the request states' bytes (settings.max_request_state_bytes, else
      datastore.requestStateBytes): the drafter's own bound on what request states hold,
      as it measures them (input tries and tokens, reservations for calls not yet run);
  D = the datastore's bytes (settings.max_resident_bytes, else datastore.expectedBytes):
      its arrays, resident or memory-mapped (a mapped snapshot's pages are charged to the
      pod's cgroup once read);
  S = one full sub-index, 8 bytes per position (4 for the token, 4 for the suffix
      position) x settings.max_sub_index_tokens (default 512M): the unit a background
      rebuild works on. While it runs, the rebuilt sub-index exists beside the served
      one (1x) and SA-IS temporaries add about 8.4 bytes per token (1.05x).

Example: D = 32 GiB, S = 4 GiB, R = 0.5 GiB, base 1 GiB: 1 + 0.5 + 32 + 2.05 x 4 = 41.7 GiB.
*/}}
{{- define "sssd-drafter.memoryMiB" -}}
{{- $d := float64 (include "sssd-drafter.maxResidentBytes" .) }}
{{- $tokens := .Values.settings.max_sub_index_tokens | default 512000000 }}
{{- $s := mulf 8 $tokens }}
{{- $headroom := mulf .Values.datastore.rebuildHeadroomFactor (minf $d $s) }}
{{- $r := float64 (include "sssd-drafter.requestStateBytes" .) }}
{{- $bytes := addf .Values.datastore.baseMemoryBytes $r $d $headroom }}
{{- printf "%.0fMi" (ceil (divf $bytes 1048576)) }}
{{- end }}

{{/* Container resources: values.resources, memory computed unless given there. */}}
{{- define "sssd-drafter.resources" -}}
{{- $res := deepCopy .Values.resources }}
{{- $memory := include "sssd-drafter.memoryMiB" . }}
{{- $requests := $res.requests | default dict }}
{{- $limits := $res.limits | default dict }}
{{- if not (hasKey $requests "memory") }}{{ $_ := set $requests "memory" $memory }}{{ end }}
{{- if not (hasKey $limits "memory") }}{{ $_ := set $limits "memory" $memory }}{{ end }}
{{- toYaml (dict "requests" $requests "limits" $limits) }}
{{- end }}

{{/* draftConfig as KEY=VALUE,KEY=VALUE (keys sorted). */}}
{{- define "sssd-drafter.draftConfig" -}}
{{- $pairs := list }}
{{- range $key, $value := . }}
{{- $pairs = append $pairs (printf "%s=%s" $key (include "sssd-drafter.envValue" $value)) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{/*
The shared log (values: sharedLog). Several replicas without it learn apart, which the
values schema refuses unless sharedLog.allowIsolatedReplicas; this check says the same
where the schema is skipped (helm --skip-schema-validation).
*/}}
{{- define "sssd-drafter.sharedLogEnabled" -}}
{{- if .Values.sharedLog.redis.address }}true{{ end }}
{{- end }}

{{- define "sssd-drafter.checkReplicas" -}}
{{- $several := or .Values.autoscaling.enabled (gt (int .Values.replicaCount) 1) }}
{{- if and $several (not (include "sssd-drafter.sharedLogEnabled" .)) (not .Values.sharedLog.allowIsolatedReplicas) }}
{{- fail "several replicas (replicaCount > 1 or autoscaling.enabled) learn as one only through a shared log: set sharedLog.redis.address (host:port of a Redis server), or sharedLog.allowIsolatedReplicas: true for replicas that each learn alone" }}
{{- end }}
{{- end }}

{{/* settings.recent_scope "client" keeps each client's requests in flight to itself: the
drafter refuses to start unless clients are told apart (auth.enabled, or tls.mutual). */}}
{{- define "sssd-drafter.checkRecentScope" -}}
{{- if and (eq (toString .Values.settings.recent_scope) "client") (not .Values.auth.enabled) (not (and .Values.tls.enabled .Values.tls.mutual)) }}
{{- fail "settings.recent_scope: client needs clients told apart: auth.enabled (bearer tokens) or tls.enabled with tls.mutual (client certificates)" }}
{{- end }}
{{- end }}

{{/* The Redis URL of the shared log: redis[s]://HOST:PORT/DB (no password: that is a file). */}}
{{- define "sssd-drafter.sharedLogUrl" -}}
{{- $redis := .Values.sharedLog.redis }}
{{- printf "%s://%s/%d" (ternary "rediss" "redis" $redis.tls) $redis.address (int $redis.db) }}
{{- end }}

{{/* Stream key prefix: sharedLog.prefix, else the release's full name. */}}
{{- define "sssd-drafter.sharedLogPrefix" -}}
{{- .Values.sharedLog.prefix | default (include "sssd-drafter.fullname" .) }}
{{- end }}

{{- define "sssd-drafter.redisPasswordDir" -}}/var/run/secrets/sssd-drafter-redis{{- end }}

{{/*
Peers to bootstrap from: the admin port behind the headless Service, whose name resolves
to every ready pod (the drafter tries each). The admin API speaks plain HTTP (tls covers
the gRPC port only).
*/}}
{{- define "sssd-drafter.bootstrapPeers" -}}
{{- printf "http://%s.%s.svc.%s:%d" (include "sssd-drafter.headlessName" .) .Release.Namespace .Values.sharedLog.bootstrap.clusterDomain (int .Values.ports.admin) }}
{{- end }}

{{/* Whether replicas bootstrap from peers: with the shared log and bootstrap.fromPeers. */}}
{{- define "sssd-drafter.bootstrapFromPeers" -}}
{{- if and (include "sssd-drafter.sharedLogEnabled" .) .Values.sharedLog.bootstrap.fromPeers }}true{{ end }}
{{- end }}
