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

{{/* Every NATS server by its name under the headless Service, or nats.url (external NATS). */}}
{{- define "nodeflow.natsUrls" -}}
{{- if not .Values.nats.enabled -}}
{{ required "nats.url is required with nats.enabled=false (an external NATS)" .Values.nats.url }}
{{- else -}}
{{- $scheme := ternary "tls" "nats" .Values.nats.tls.enabled -}}
{{- $urls := list -}}
{{- range $index := until (int .Values.nats.replicas) -}}
{{- $urls = append $urls (printf "%s://nats-%d.nats-headless.%s.svc:4222" $scheme $index $.Release.Namespace) -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}
{{- end -}}

{{/* The client ports of nats.url's servers (4222 when a URL names none), for NetworkPolicies. */}}
{{- define "nodeflow.externalNatsPorts" -}}
{{- $ports := list -}}
{{- range $url := splitList "," .Values.nats.url -}}
{{- $port := regexFind ":[0-9]+/?$" (trim $url) | trimPrefix ":" | trimSuffix "/" | default "4222" -}}
{{- $ports = append $ports (int $port) -}}
{{- end -}}
{{- toJson (uniq $ports) -}}
{{- end -}}

{{/*
Where a pod may run and its priority: the component's own nodeSelector, tolerations, affinity
and priorityClassName, else the chart-wide ones (the root values). `extraAffinity` (NATS'
one-server-per-node preference) is kept unless the affinity chosen has its own podAntiAffinity.
Called with (dict "root" $ "own" <the component's values> "extraAffinity" <dict or nil>).
*/}}
{{- define "nodeflow.podPlacement" -}}
{{- $values := .root.Values -}}
{{- $own := .own -}}
{{- $nodeSelector := ternary $own.nodeSelector $values.nodeSelector (hasKey $own "nodeSelector") -}}
{{- $tolerations := ternary $own.tolerations $values.tolerations (hasKey $own "tolerations") -}}
{{- $affinity := deepCopy (ternary $own.affinity $values.affinity (hasKey $own "affinity") | default dict) -}}
{{- $priority := ternary $own.priorityClassName $values.priorityClassName (hasKey $own "priorityClassName") -}}
{{- if and .extraAffinity (not (hasKey $affinity "podAntiAffinity")) -}}
{{- $affinity = merge $affinity .extraAffinity -}}
{{- end -}}
{{- with $nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $priority }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{/*
A duration in seconds: a number as is, or a Go-style duration string as SUNK's values take it
("90s", "5m", "1h", "1h30m").
*/}}
{{- define "nodeflow.seconds" -}}
{{- if kindIs "string" . -}}
{{- $total := 0 -}}
{{- range $part := regexFindAll "[0-9]+(h|m|s)" . -1 -}}
{{- $n := int (trimSuffix "h" (trimSuffix "m" (trimSuffix "s" $part))) -}}
{{- $unit := ternary 3600 (ternary 60 1 (hasSuffix "m" $part)) (hasSuffix "h" $part) -}}
{{- $total = add $total (mul $n $unit) -}}
{{- end -}}
{{- $total -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{/*
JetStream's file store limit from the volume size (nats.storage.size, Mi/Gi/Ti): 80% of it in
bytes, leaving the rest to the filesystem and to the store's compaction.
*/}}
{{- define "nodeflow.natsMaxFileStore" -}}
{{- $size := .Values.nats.storage.size -}}
{{- $number := int64 (regexFind "^[0-9]+" $size) -}}
{{- $unit := dict "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 -}}
{{- $bytes := mul $number (index $unit (trimPrefix (toString $number) $size)) -}}
{{- div (mul $bytes 4) 5 -}}
{{- end -}}

{{/*
A service's environment from the values: the chart-wide `env`, then the service's own (which
wins), then the nodeset-controller options under SUNK's names (operator.config.operator.nodeSet).
Names are checked by values.schema.json against each service's settings.
*/}}
{{- define "nodeflow.extraEnv" -}}
{{- $values := .root.Values -}}
{{- $env := merge (deepCopy (.service.env | default dict)) ($values.env | default dict) -}}
{{- if eq .name "nodeset-controller" -}}
{{- $nodeSet := $values.operator.config.operator.nodeSet -}}
{{- if hasKey $nodeSet "scaleDownPriorityOrdering" -}}
{{- $_ := set $env "SCALE_DOWN_PRIORITY_ORDERING" $nodeSet.scaleDownPriorityOrdering -}}
{{- end -}}
{{- if hasKey $nodeSet "forceScalingDeleteKnownConditionTimeout" -}}
{{- $_ := set $env "FORCE_SCALING_DELETE_KNOWN_CONDITION_TIMEOUT" (include "nodeflow.seconds" $nodeSet.forceScalingDeleteKnownConditionTimeout) -}}
{{- end -}}
{{- if hasKey $nodeSet "forceScalingDeleteUnknownConditionTimeout" -}}
{{- $_ := set $env "FORCE_SCALING_DELETE_UNKNOWN_CONDITION_TIMEOUT" (include "nodeflow.seconds" $nodeSet.forceScalingDeleteUnknownConditionTimeout) -}}
{{- end -}}
{{- end -}}
{{- range $key := keys $env | sortAlpha }}
- name: {{ $key }}
  value: {{ index $env $key | toString | quote }}
{{- end }}
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
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [create, delete]
# topology-placer's volume.kubernetes.io/selected-node on a WaitForFirstConsumer claim.
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [patch]
- apiGroups: [apps]
  resources: [controllerrevisions]
  verbs: [create, delete]
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
  value: /etc/nodeflow/slurm/{{ $cluster.name }}/jwt/jwt_hs256.key
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

{{/*
"true" when the chart may render a cluster-scoped object it creates only where it is missing
(the Skyhook namespace, the third-party CRDs): absent from the cluster, or already this
release's. One created by someone else (an operator, `kubectl create`) is left to its owner
instead of failing the install with "exists and cannot be imported". `helm template` and
client-side dry runs see no cluster: they always render it.
Called with (dict "root" $ "apiVersion" ... "kind" ... "name" ...).
*/}}
{{- define "nodeflow.ownedOrMissing" -}}
{{- $found := lookup .apiVersion .kind "" .name -}}
{{- if not $found -}}
true
{{- else -}}
{{- $annotations := $found.metadata.annotations | default dict -}}
{{- if and (eq (index $annotations "meta.helm.sh/release-name" | default "") .root.Release.Name) (eq (index $annotations "meta.helm.sh/release-namespace" | default "") .root.Release.Namespace) -}}
true
{{- end -}}
{{- end -}}
{{- end -}}
