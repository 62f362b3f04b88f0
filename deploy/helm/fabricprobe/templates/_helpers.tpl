{{- define "fabricprobe.labels" -}}
app.kubernetes.io/name: fabricprobe
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
{{- define "fabricprobe.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}
{{- define "fabricprobe.collectorAddress" -}}
{{ .Release.Name }}-collector.{{ .Release.Namespace }}.svc:{{ .Values.collector.grpcPort }}
{{- end -}}
