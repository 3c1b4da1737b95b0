{{/*
What each service is: its description, and whether it talks to the Kubernetes API (only
k8s-watcher does, so only it mounts a ServiceAccount token).
*/}}
{{- define "nodeflow.serviceInfo" -}}
k8s-watcher:
  description: Watches the Kubernetes API into NATS and applies Kubernetes commands; the only holder of Kubernetes credentials.
  kubeAPI: true
slurm-syncer:
  description: Mirrors slurmrestd into NATS and applies Slurm drain/undrain commands; the only holder of a Slurm token.
  kubeAPI: false
nodeset-controller:
  description: Reconciles NodeSets over NATS.
  kubeAPI: false
maintenance-scheduler:
  description: Schedules and runs NodeMaintenances over NATS.
  kubeAPI: false
topology-placer:
  description: Gang and network-topology placement and job preemption over NATS.
  kubeAPI: false
metrics-exporter:
  description: Prometheus view of the events on NATS.
  kubeAPI: false
{{- end -}}

{{- define "nodeflow.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/*
The Secret of a NATS user (a service, or nodeflow-admin): nodeflow-<service>-nats and
nodeflow-admin-nats unless nats.credentials.secretNames names another.
*/}}
{{- define "nodeflow.natsSecret" -}}
{{- $user := .user -}}
{{- $default := printf "%s-nats" (ternary $user (printf "nodeflow-%s" $user) (eq $user "nodeflow-admin")) -}}
{{- index .root.Values.nats.credentials.secretNames $user | default $default -}}
{{- end -}}

{{/* `gpu-east` -> `GPU_EAST`, as slurm-syncer names a cluster's variables. */}}
{{- define "nodeflow.envSuffix" -}}
{{- regexReplaceAll "[^A-Za-z0-9]" . "_" | upper -}}
{{- end -}}

{{/* Every NATS server by its name under the headless Service. */}}
{{- define "nodeflow.natsUrls" -}}
{{- $scheme := ternary "tls" "nats" .Values.nats.tls.enabled -}}
{{- $urls := list -}}
{{- range $index := until (int .Values.nats.replicas) -}}
{{- $urls = append $urls (printf "%s://nats-%d.nats-headless.%s.svc:4222" $scheme $index $.Release.Namespace) -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}

{{- define "nodeflow.labels" -}}
app.kubernetes.io/part-of: nodeflow
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The restricted Pod Security Standard, for every container. */}}
{{- define "nodeflow.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
privileged: false
capabilities:
  drop:
  - ALL
{{- end -}}

{{/*
Every write k8s-watcher makes to namespaced objects: per namespace when commandNamespaces lists
some (a Role in each, as the production overlay's workload-rbac.yaml), else cluster-wide.
*/}}
{{- define "nodeflow.namespacedWriteRules" -}}
- apiGroups: [""]
  resources: [pods]
  verbs: [create, delete, patch]
- apiGroups: [""]
  resources: [pods/status]
  verbs: [patch]
- apiGroups: [""]
  resources: [pods/eviction, pods/binding]
  verbs: [create]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [create, delete, patch]
- apiGroups: [nodeflow.dev]
  resources: [nodeslices]
  verbs: [create, delete, patch]
- apiGroups: [nodeflow.dev]
  resources: [nodesets]
  verbs: [patch]
- apiGroups: [nodeflow.dev]
  resources: [nodesets/status, nodeslices/status]
  verbs: [patch]
- apiGroups: [maintenance.nvidia.com]
  resources: [nodemaintenances]
  verbs: [create, delete, patch]
- apiGroups: [maintenance.nvidia.com]
  resources: [maintenanceoperatorconfigs]
  verbs: [patch]
- apiGroups: [maintenance.nvidia.com]
  resources: [nodemaintenances/status, maintenanceoperatorconfigs/status]
  verbs: [patch]
- apiGroups: [scheduling.sigs.k8s.io]
  resources: [podgroups]
  verbs: [patch]
- apiGroups: [scheduling.sigs.k8s.io]
  resources: [podgroups/status]
  verbs: [patch]
{{- end -}}

{{/*
slurm-syncer's clusters: SLURM_CLUSTERS, then per cluster its URL, the JWT signing key file
(the syncer mints its own short-lived tokens from it) and the CA of an https URL.
*/}}
{{- define "nodeflow.slurmEnv" -}}
{{- $names := list -}}
{{- range .Values.slurm.clusters }}{{ $names = append $names .name }}{{ end -}}
- name: SLURM_CLUSTERS
  value: {{ join "," $names | quote }}
{{- range $cluster := .Values.slurm.clusters }}
{{- $suffix := include "nodeflow.envSuffix" $cluster.name }}
- name: SLURM_{{ $suffix }}_URL
  value: {{ required (printf "slurm.clusters[%s].url is required" $cluster.name) $cluster.url | quote }}
- name: SLURM_{{ $suffix }}_JWT_KEY_FILE
  value: /etc/nodeflow/slurm/{{ $cluster.name }}/jwt/jwt.key
{{- if $cluster.caSecret }}
- name: SLURM_{{ $suffix }}_CA_FILE
  value: /etc/nodeflow/slurm/{{ $cluster.name }}/ca/ca.crt
{{- end }}
{{- if $cluster.user }}
- name: SLURM_{{ $suffix }}_USER
  value: {{ $cluster.user | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Pod template labels: without the chart version, so a chart upgrade alone rolls no pod. */}}
{{- define "nodeflow.podLabels" -}}
app.kubernetes.io/part-of: nodeflow
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- /*
The settings of the NATS cluster block (routes to every server through the headless Service),
shared by nats.conf and, with TLS, nats-production.conf, whose own cluster block replaces it.
*/ -}}
{{- define "nodeflow.natsCluster" -}}
name: nodeflow
port: 6222
routes: [
{{- range $index := until .replicas }}
  nats://nats-{{ $index }}.nats-headless.{{ $.namespace }}.svc:6222
{{- end }}
]
# Pods start in parallel and their DNS names appear one by one: keep trying.
connect_retries: 120
{{- end }}
