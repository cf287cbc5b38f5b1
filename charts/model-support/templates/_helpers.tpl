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

{{/* The viewer's and the publish CronJob's own ServiceAccounts: no API token, no rights. */}}
{{- define "model-support.viewerServiceAccount" -}}
{{- printf "%s-viewer" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "model-support.publishServiceAccount" -}}
{{- printf "%s-publish" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The namespaced permissions: what the operator does where tests live. */}}
{{- define "model-support.rules" -}}
# create: a ModelSupportSweep's tests and a ModelSupportBisect's steps (patch: a sweep re-runs a
# finished one).
- apiGroups: [modelsupport.dev]
  resources: [modelsupporttests]
  verbs: [get, list, watch, create, patch]
- apiGroups: [modelsupport.dev]
  resources: [modelsupporttests/status]
  verbs: [get, patch]
- apiGroups: [modelsupport.dev]
  resources: [modelsupportsweeps]
  verbs: [get, list, watch]
- apiGroups: [modelsupport.dev]
  resources: [modelsupportsweeps/status]
  verbs: [get, patch]
- apiGroups: [modelsupport.dev]
  resources: [modelsupportbisects]
  verbs: [get, list, watch]
- apiGroups: [modelsupport.dev]
  resources: [modelsupportbisects/status]
  verbs: [get, patch]
# Children carry owner references with blockOwnerDeletion: that needs update on finalizers.
- apiGroups: [modelsupport.dev]
  resources: [modelsupporttests/finalizers, modelsupportsweeps/finalizers, modelsupportbisects/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create]
# patch: a recorded Job is labelled and handed to the TTL controller.
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, delete, patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create]
# create: one Secret per runner attempt holding its delivery slot's upload URL (S3 stores).
- apiGroups: [""]
  resources: [secrets]
  verbs: [create]
{{- if .Values.readHubTokenSecrets }}
# A test's Hub token Secret (readHubTokenSecrets): read by a list selected by its name and the
# label modelsupport.dev/hub-token=true, so the API server returns no other Secret to the
# operator; never get. hubTokenSecretNames limits it to those names (resourceNames).
- apiGroups: [""]
  resources: [secrets]
  verbs: [list]
  {{- with .Values.hubTokenSecretNames }}
  resourceNames: {{ toJson . }}
  {{- end }}
{{- end }}
{{- if .Values.neuron.dra.enabled }}
# One ResourceClaimTemplate per test generation (DRA); pods' claims are made from it.
- apiGroups: [resource.k8s.io]
  resources: [resourceclaimtemplates]
  verbs: [get, create]
{{- end }}
{{- end -}}

{{/* The operator's settings as one JSON object (operator/src/settings.py, settings_from_values). */}}
{{- define "model-support.settings" -}}
{{- $results := required "the chart value `results` is required: where run records go, e.g. --set results=s3://my-bucket/model-support" .Values.results -}}
{{- $s := dict "resultsUri" $results "namespaces" (.Values.watchNamespaces | default list) "allNamespaces" (empty .Values.watchNamespaces) "readTokenSecrets" (.Values.readHubTokenSecrets | default false) -}}
{{- if .Values.runnerImage }}{{- $_ := set $s "runnerImage" .Values.runnerImage }}{{- end }}
{{- if .Values.runnerStack }}{{- $_ := set $s "runnerStack" .Values.runnerStack }}{{- end }}
{{- if .Values.resultsVolume.enabled }}{{- $_ := set $s "resultsVolumeClaim" .Values.resultsVolume.claimName }}{{- end }}
{{- if .Values.allowedResultsPrefixes }}{{- $_ := set $s "allowedResultsPrefixes" .Values.allowedResultsPrefixes }}{{- end }}
{{- with .Values.runner }}
{{- if .schedulerName }}{{- $_ := set $s "schedulerName" .schedulerName }}{{- end }}
{{- if .lncNodeLabel }}{{- $_ := set $s "lncNodeLabel" .lncNodeLabel }}{{- end }}
{{- if hasKey . "defaultLnc" }}{{- $_ := set $s "runnerDefaultLnc" .defaultLnc }}{{- end }}
{{- if .serviceAccountName }}{{- $_ := set $s "serviceAccount" .serviceAccountName }}{{- end }}
{{- if .env }}{{- $_ := set $s "runnerEnv" .env }}{{- end }}
{{- if .envFrom }}{{- $_ := set $s "runnerEnvFrom" .envFrom }}{{- end }}
{{- end }}
{{- if .Values.neuron.dra.enabled }}{{- $_ := set $s "neuronDra" (omit .Values.neuron.dra "enabled") }}{{- end }}
{{- if .Values.metrics.enabled }}{{- $_ := set $s "metricsPort" .Values.metrics.port }}{{- end }}
{{- $_ := set $s "notifyFormat" (.Values.notifications.format | default "slack") }}
{{- $_ := set $s "notifyAttempts" (.Values.notifications.attempts | default 5) }}
{{- $merged := merge (deepCopy (.Values.settings | default dict)) $s -}}
{{- if not .Values.metrics.enabled }}{{- $_ := set $merged "metricsPort" nil }}{{- end }}
{{- /* runner.defaultLnc: null deletes the key (Helm's null): no default LNC, spec.lnc required */}}
{{- if not (hasKey (.Values.runner | default dict) "defaultLnc") }}{{- $_ := set $merged "runnerDefaultLnc" nil }}{{- end }}
{{- toJson $merged -}}
{{- end -}}

{{/* Namespaces that get the runner NetworkPolicy. */}}
{{- define "model-support.policyNamespaces" -}}
{{- if .Values.networkPolicy.namespaces -}}
{{- toJson .Values.networkPolicy.namespaces -}}
{{- else if .Values.watchNamespaces -}}
{{- toJson .Values.watchNamespaces -}}
{{- else -}}
{{- toJson (list .Release.Namespace) -}}
{{- end -}}
{{- end -}}
