{{/* The release's object names: RELEASE-COMPONENT, or RELEASE-hoptrace-COMPONENT when the release's name
does not say hoptrace. */}}
{{- define "hoptrace.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Every label of one component's objects: (list $ "agent") */}}
{{- define "hoptrace.labels" -}}
{{- $root := index . 0 -}}
{{ include "hoptrace.selector" . }}
app.kubernetes.io/component: {{ index . 1 }}
app.kubernetes.io/part-of: hoptrace
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: (list $ "agent") */}}
{{- define "hoptrace.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ printf "hoptrace-%s" (index . 1) }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
{{- end -}}

{{- define "hoptrace.image" -}}
{{- printf "%s:%s" .repository (toString .tag) -}}
{{- end -}}

{{/* Where the other components reach each service: the value given, else the Service's DNS name. */}}
{{- define "hoptrace.dispatcherHost" -}}
{{- .Values.dispatcher.host | default (printf "%s-dispatcher.%s.svc" (include "hoptrace.fullname" .) .Release.Namespace) -}}
{{- end -}}

{{- define "hoptrace.collectorHost" -}}
{{- .Values.collector.host | default (printf "%s-collector.%s.svc" (include "hoptrace.fullname" .) .Release.Namespace) -}}
{{- end -}}

{{- define "hoptrace.dispatcherAddress" -}}
{{- printf "%s:%d" (include "hoptrace.dispatcherHost" .) (int .Values.dispatcher.port) -}}
{{- end -}}

{{- define "hoptrace.influxURL" -}}
{{- if .Values.influxdb.url -}}
{{- .Values.influxdb.url -}}
{{- else if .Values.influxdb.enabled -}}
{{- printf "http://%s-influxdb.%s.svc:8086" (include "hoptrace.fullname" .) .Release.Namespace -}}
{{- else -}}
{{- fail "influxdb.enabled is false: set influxdb.url to your InfluxDB" -}}
{{- end -}}
{{- end -}}

{{/* The InfluxDB flags of the dispatcher and the collector (its token comes from the Secret, in env). */}}
{{- define "hoptrace.influxArgs" -}}
- --influx-url={{ include "hoptrace.influxURL" . }}
- --influx-bucket={{ .Values.influxdb.bucket }}
- --influx-org={{ .Values.influxdb.org }}
{{- end -}}

{{- define "hoptrace.influxTokenEnv" -}}
- name: HOPTRACE_INFLUX_TOKEN
  valueFrom: {secretKeyRef: {name: {{ .Values.secrets.influxdb }}, key: token}}
{{- end -}}

{{/* Pod and container security of the control plane (collector, web UI, dispatcher, InfluxDB): what the
"restricted" Pod Security Standard asks. */}}
{{- define "hoptrace.restrictedContainer" -}}
allowPrivilegeEscalation: false
capabilities: {drop: ["ALL"]}
{{- end -}}

{{- define "hoptrace.restrictedPod" -}}
runAsNonRoot: true
runAsUser: {{ . }}
runAsGroup: {{ . }}
fsGroup: {{ . }}
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{/* A projected view of the certificates Secret: only the files one component needs. */}}
{{- define "hoptrace.certsVolume" -}}
{{- $root := index . 0 -}}
- name: certs
  secret:
    secretName: {{ $root.Values.secrets.certs }}
    defaultMode: 0440  # the pod's fsGroup reads them
    items:
{{- range (index . 1) }}
      - {key: {{ . }}, path: {{ . }}}
{{- end }}
{{- end -}}
