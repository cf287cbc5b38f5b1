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
# run.py's program, one per namespace: get (looked at again), delete (one changed by hand is
# made again).
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, delete]
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
# list: the Job controller's FailedCreate Events on runner Jobs (why a pod was refused).
- apiGroups: [""]
  resources: [events]
  verbs: [list]
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
# One ResourceClaimTemplate per test generation (DRA); pods' claims are made from it. delete:
# a generation superseded by a spec change.
- apiGroups: [resource.k8s.io]
  resources: [resourceclaimtemplates]
  verbs: [get, create, delete]
{{- end }}
{{- end -}}

{{/* The operator's settings as one JSON object (operator/src/settings.py, settings_from_values). */}}
{{- define "model-support.settings" -}}
{{- $results := required "the chart value `results` is required: where run records go, e.g. --set results=s3://my-bucket/model-support" .Values.results -}}
{{- include "model-support.checkWatch" . -}}
{{- $s := dict "resultsUri" $results "namespaces" (.Values.watchNamespaces | default list) "allNamespaces" (.Values.watchAllNamespaces | default false) "readTokenSecrets" (.Values.readHubTokenSecrets | default false) -}}
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

{{/* Namespaces that get the runner NetworkPolicy: every watched one, and those listed in
networkPolicy.namespaces (required when watching all namespaces: the chart cannot know them). */}}
{{- define "model-support.policyNamespaces" -}}
{{- include "model-support.checkWatch" . -}}
{{- if and .Values.watchAllNamespaces (not .Values.networkPolicy.namespaces) -}}
{{- fail "watchAllNamespaces: list the namespaces where runner pods run in networkPolicy.namespaces (the runner NetworkPolicy is namespaced and the chart cannot know them), or set networkPolicy.enabled=false and apply your own (docs/security.md)" -}}
{{- end -}}
{{- toJson (concat (.Values.watchNamespaces | default list) (.Values.networkPolicy.namespaces | default list) | uniq) -}}
{{- end -}}

{{/* The delivery key's Secret and key, as {name, key}; fails, saying what to do, unless exactly
one of deliveryKey.existingSecret and deliveryKey.value is given. */}}
{{- define "model-support.deliveryKeyRef" -}}
{{- $k := .Values.deliveryKey | default dict -}}
{{- if and $k.existingSecret $k.value -}}
{{- fail "deliveryKey: give existingSecret or value, not both" -}}
{{- else if $k.existingSecret -}}
name: {{ $k.existingSecret }}
key: {{ $k.secretKey | default "key" }}
{{- else if $k.value -}}
{{- if lt (len $k.value) 32 -}}
{{- fail (printf "deliveryKey.value is %d characters long: give at least 32 (e.g. openssl rand -base64 36)" (len $k.value)) -}}
{{- end -}}
name: {{ include "model-support.fullname" . }}-delivery-key
key: key
{{- else -}}
{{- fail "the chart value deliveryKey is required: the key naming runner pods' delivery slots must be the same in every replica and every render, so the chart does not draw one. Create a Secret (kubectl -n <namespace> create secret generic model-support-delivery-key --from-literal=key=\"$(openssl rand -base64 36)\") and set deliveryKey.existingSecret=model-support-delivery-key, or set deliveryKey.value (at least 32 characters)" -}}
{{- end -}}
{{- end -}}

{{/* Fails, saying what to do, unless the watched namespaces are given one way: a list, or
watchAllNamespaces explicitly. */}}
{{- define "model-support.checkWatch" -}}
{{- if and .Values.watchNamespaces .Values.watchAllNamespaces -}}
{{- fail "give watchNamespaces or watchAllNamespaces=true, not both" -}}
{{- else if not (or .Values.watchNamespaces .Values.watchAllNamespaces) -}}
{{- fail "the chart value watchNamespaces is required: list the namespaces where tests run (the operator gets its rights, and runner pods their NetworkPolicy, only there), e.g. --set 'watchNamespaces={ml}'; to watch every namespace, kube-system included, set watchAllNamespaces=true explicitly" -}}
{{- end -}}
{{- end -}}
