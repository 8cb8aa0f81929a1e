{{- define "sluice.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sluice.labels" -}}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "sluice.scheme" -}}
{{- if .Values.tls.enabled }}HTTPS{{ else }}HTTP{{ end -}}
{{- end -}}

{{/* sluice.yaml, from the values. */}}
{{- define "sluice.config" -}}
server:
  listen: "0.0.0.0:8080"
  {{- if .Values.decisionTimeout }}
  decision_timeout: {{ .Values.decisionTimeout }}
  {{- end }}
  {{- if .Values.tls.enabled }}
  tls:
    cert_file: /etc/sluice/tls/tls.crt
    key_file: /etc/sluice/tls/tls.key
  {{- end }}
  {{- with .Values.auth.tokens }}
  auth:
    tokens:
      {{- range . }}
      - id: {{ .id | quote }}
        secret_env: {{ printf "SLUICE_TOKEN_%s" (.id | upper | replace "-" "_") | quote }}
        scopes: {{ toJson .scopes }}
      {{- end }}
  {{- end }}
store:
  {{- $r := .Values.store.redis }}
  {{- if eq .Values.store.type "memory" }}
  type: memory
  {{- with .Values.store.memory.maxKeys }}
  memory:
    max_keys: {{ . | int64 }}
  {{- end }}
  {{- else }}
  type: redis
  redis:
    {{- if eq .Values.store.type "redis" }}
    url: {{ required "store.redis.url is required with store.type redis" $r.url | quote }}
    {{- else if or (eq .Values.store.type "cluster") (eq .Values.store.type "sentinel") }}
    {{- if not $r.addrs }}
    {{- fail (printf "store.redis.addrs is required with store.type %s: the %s, such as --set 'store.redis.addrs={%s}'" .Values.store.type (ternary "cluster's seed nodes" "sentinels" (eq .Values.store.type "cluster")) (ternary "redis-0:6379,redis-1:6379" "sentinel-0:26379,sentinel-1:26379" (eq .Values.store.type "cluster"))) }}
    {{- end }}
    addrs: {{ $r.addrs | toJson }}
    mode: {{ .Values.store.type }}
    {{- if eq .Values.store.type "sentinel" }}
    master_name: {{ required "store.redis.masterName is required with store.type sentinel" $r.masterName | quote }}
    {{- end }}
    {{- else }}
    {{- fail (printf "store.type %q: must be memory, redis, cluster or sentinel" .Values.store.type) }}
    {{- end }}
    {{- with $r.username }}
    username: {{ . | quote }}
    {{- end }}
    {{- if $r.passwordSecret.name }}
    password_env: SLUICE_REDIS_PASSWORD
    {{- end }}
    {{- with $r.timeout }}
    timeout: {{ . }}
    {{- end }}
    {{- with $r.dialTimeout }}
    dial_timeout: {{ . }}
    {{- end }}
  {{- end }}
subjects:
  hmac_keys:
    {{- range .Values.hmacKeys.keys }}
    - { id: {{ . | quote }}, secret_env: {{ printf "SLUICE_HMAC_%s" (. | upper) | quote }} }
    {{- end }}
{{- with .Values.policies }}
policies:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .Values.envoy.enabled }}
envoy:
  listen: {{ printf "0.0.0.0:%v" .Values.envoy.port | quote }}
  configs: ["/etc/sluice/rules/*.yaml"]
{{- end }}
{{- end -}}
