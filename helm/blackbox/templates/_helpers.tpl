{{/* The chart's name, 63 characters at most. */}}
{{- define "blackbox.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's base name for every object. */}}
{{- define "blackbox.fullname" -}}
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

{{- define "blackbox.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "blackbox.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "blackbox.selectorLabels" -}}
app.kubernetes.io/name: {{ include "blackbox.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of one role's pods: the shared ones plus the role. Call with (dict "root" $ "role" NAME). */}}
{{- define "blackbox.roleSelectorLabels" -}}
{{ include "blackbox.selectorLabels" .root }}
app.kubernetes.io/component: {{ .role }}
{{- end }}

{{/* One role's Deployment name: the release's for the `run` role, suffixed otherwise. */}}
{{- define "blackbox.roleName" -}}
{{- if eq .role "run" }}{{ include "blackbox.fullname" .root }}{{ else }}{{ printf "%s-%s" (include "blackbox.fullname" .root) .role | trunc 63 | trimSuffix "-" }}{{ end }}
{{- end }}

{{- define "blackbox.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "blackbox.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "blackbox.secretName" -}}
{{- default (include "blackbox.fullname" .) .Values.secret.existingSecret }}
{{- end }}

{{- define "blackbox.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
An environment value as text. Numbers arrive as floats (YAML and JSON values both): whole
ones are written without a fraction or exponent, so 315576000 stays "315576000".
*/}}
{{- define "blackbox.envValue" -}}
{{- if kindIs "float64" . }}
{{- if eq . (floor .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else }}
{{- . }}
{{- end }}
{{- end }}

{{/* The HTTP port of the page, the API and the probes, as a number. */}}
{{- define "blackbox.httpPort" -}}
{{- include "blackbox.envValue" .Values.config.BLACKBOX_HTTP_PORT }}
{{- end }}

{{/* The probes' own port as a number, or "off". */}}
{{- define "blackbox.probePort" -}}
{{- include "blackbox.envValue" (default "off" .Values.config.BLACKBOX_PROBE_PORT) }}
{{- end }}

{{/* The name of the container port the probes and the ServiceMonitor use. */}}
{{- define "blackbox.probePortName" -}}
{{- if eq (include "blackbox.probePort" .) "off" }}http{{ else }}probes{{ end }}
{{- end }}

{{- define "blackbox.policyPath" -}}
/etc/blackbox/policy.yaml
{{- end }}

{{- define "blackbox.apiTokensPath" -}}
/etc/blackbox-api-tokens/api-tokens.yaml
{{- end }}

{{/* Fails rendering when SIGTERM's drain could outlast the grace period. */}}
{{- define "blackbox.checkGracePeriod" -}}
{{- $timeout := include "blackbox.envValue" .Values.config.BLACKBOX_DELIVERY_TIMEOUT | float64 }}
{{- $least := addf (mulf 2 $timeout) 12 }}
{{- if lt (float64 .Values.terminationGracePeriodSeconds) $least }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be at least 2 x BLACKBOX_DELIVERY_TIMEOUT + 12 = %v s, the longest drain on SIGTERM" .Values.terminationGracePeriodSeconds $least) }}
{{- end }}
{{- end }}

{{/* "true" when a role runs: `enabled` absent counts as on (a new entry needs only its args). */}}
{{- define "blackbox.roleEnabled" -}}
{{- if or (not (hasKey . "enabled")) .enabled }}true{{ end }}
{{- end }}

{{/* Fails rendering when no role is enabled: the release would run nothing. */}}
{{- define "blackbox.checkRoles" -}}
{{- $enabled := list }}
{{- range $role, $spec := .Values.roles }}{{ if include "blackbox.roleEnabled" $spec }}{{ $enabled = append $enabled $role }}{{ end }}{{ end }}
{{- if not $enabled }}
{{- fail "roles: enable at least one role (roles.run.enabled=true runs intake and firing)" }}
{{- end }}
{{- end }}

{{/* A role's replicas: its autoscaler's maximum when autoscaled, else `replicas` (0 kept). */}}
{{- define "blackbox.roleReplicas" -}}
{{- $autoscaling := mergeOverwrite (deepCopy .root.Values.autoscaling) (default dict .spec.autoscaling) }}
{{- if $autoscaling.enabled }}{{ $autoscaling.maxReplicas }}{{ else if hasKey .spec "replicas" }}{{ .spec.replicas }}{{ else }}1{{ end }}
{{- end }}

{{/* The shard count the pods run with: BLACKBOX_SHARDS, or 16 (a new namespace's) when empty. */}}
{{- define "blackbox.shards" -}}
{{- $set := include "blackbox.envValue" .Values.config.BLACKBOX_SHARDS }}
{{- if $set }}{{ $set }}{{ else }}16{{ end }}
{{- end }}

{{/*
Fails rendering when more replicas fire than there are shards: only a shard's owner fires
it, so the replicas past the shard count would own none and add no firing capacity.
Roles run with `--role intake` do not fire and are not counted.
*/}}
{{- define "blackbox.checkShards" -}}
{{- $firing := 0 }}
{{- $parts := list }}
{{- range $role, $spec := .Values.roles }}
{{- $args := join " " (default list $spec.args) }}
{{- if and (include "blackbox.roleEnabled" $spec) (not (regexMatch "--role(=| )intake" $args)) }}
{{- $n := include "blackbox.roleReplicas" (dict "root" $ "spec" $spec) | int }}
{{- $firing = add $firing $n }}
{{- $parts = append $parts (printf "%s: %d" $role $n) }}
{{- end }}
{{- end }}
{{- $shards := include "blackbox.shards" . | int }}
{{- if gt $firing $shards }}
{{- fail (printf "%d replicas fire (%s, an autoscaler counted at its maxReplicas) but there are %d shards (config.BLACKBOX_SHARDS): only a shard's owner fires it, so %d replica(s) would fire nothing. Raise BLACKBOX_SHARDS (on a new namespace, or with every replica stopped and nothing pending) or lower the replicas" $firing (join ", " $parts) $shards (sub $firing $shards)) }}
{{- end }}
{{- end }}
