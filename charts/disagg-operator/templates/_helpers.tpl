{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "disagg-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: the release name, plus the chart name unless the release name already
contains it. Cluster-scoped objects (ClusterRole/Binding) use it too, so two
releases never collide.
*/}}
{{- define "disagg-operator.fullname" -}}
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

{{/* Name of cluster-scoped objects: also carries the release namespace. */}}
{{- define "disagg-operator.clusterName" -}}
{{- printf "%s-%s" (include "disagg-operator.fullname" .) .Release.Namespace | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "disagg-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "disagg-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "disagg-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "disagg-operator.labels" -}}
helm.sh/chart: {{ include "disagg-operator.chart" . }}
{{ include "disagg-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: disagg-operator
{{- end }}

{{- define "disagg-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "disagg-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "disagg-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The operator's API permissions, least privilege (shared by Role and ClusterRole); every verb
is used by the code path tests/integration/test_chart.py::VERB_USES names.
Server-side apply is a PATCH; creating through apply also needs create.
Events are core/v1 (the operator's and Kopf's own), created only; events.k8s.io is not used.
pods get: held so that the operator may grant it in each router's pods-only Role.
pods/status patch: the operator owns the pods' disagg.dev/routable readiness gate.
Secrets: get only, and only when prometheus.allowedUrls lets a DisaggDeployment name its own
Prometheus and credentials (the operator then uses a Secret only if allowed or labelled).
*/}}
{{- define "disagg-operator.rules" -}}
- apiGroups: [disagg.dev]
  resources: [disaggdeployments]
  verbs: [get, list, watch]
- apiGroups: [disagg.dev]
  resources: [disaggdeployments/status]
  verbs: [patch]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, patch]
- apiGroups: [""]
  resources: [pods/status]
  verbs: [patch]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# The router of each DisaggDeployment: its ServiceAccount and a Role to read pods (the
# operator holds pods get/list/watch itself, so it may grant them; no escalate/bind needed).
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [list, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [list, create, patch, delete]
{{- if .Values.prometheus.allowedUrls }}
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end }}
{{- if .Values.podMonitors.enabled }}
# The PodMonitor of each DisaggDeployment (reconcile.reconcile_pod_monitor).
- apiGroups: [monitoring.coreos.com]
  resources: [podmonitors]
  verbs: [list, create, patch, delete]
{{- end }}
{{- end }}

{{/*
The Lease this release holds: leaderElection.leaseName, with "-<shard.name>" for a shard
(the operator appends the same suffix to --leader-election-id, disagg.shard.lease_name).
*/}}
{{- define "disagg-operator.leaseName" -}}
{{- if and .Values.shard.selector (not .Values.shard.name) }}
{{- fail "shard.name is required with shard.selector: it names the shard's Lease" }}
{{- end }}
{{- if .Values.shard.name }}
{{- printf "%s-%s" .Values.leaderElection.leaseName .Values.shard.name }}
{{- else }}
{{- .Values.leaderElection.leaseName }}
{{- end }}
{{- end }}
