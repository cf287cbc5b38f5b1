{{- define "model-support.fullname" -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "model-support.labels" -}}
app.kubernetes.io/name: model-support
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "model-support.selector" -}}
app.kubernetes.io/name: model-support
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "model-support.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "model-support.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The namespaced permissions: what the operator does where tests live. */}}
{{- define "model-support.rules" -}}
- apiGroups: [modelsupport.dev]
  resources: [modelsupporttests]
  verbs: [get, list, watch, patch]
- apiGroups: [modelsupport.dev]
  resources: [modelsupporttests/status]
  verbs: [get, patch]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, delete]
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create]
{{- if .Values.rbac.readHubTokenSecrets }}
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end }}
{{- end -}}
