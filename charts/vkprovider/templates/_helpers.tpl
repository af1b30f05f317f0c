{{/*
Names. Every object is named after "vkprovider.fullname": the release name when it contains
"vkprovider" (release "vkprovider" gives the names of manifests/base), else
"<release>-vkprovider". Cut to 42 characters so that the longest suffix ("-companion-leader")
still fits a 63-character name.
*/}}
{{- define "vkprovider.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 42 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 42 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 42 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object; (dict "ctx" $ "component" "...") */}}
{{- define "vkprovider.labels" -}}
app.kubernetes.io/name: vkprovider
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
{{- end -}}

{{/* Selector labels of one component's pods; (dict "ctx" $ "component" "...") */}}
{{- define "vkprovider.selector" -}}
app.kubernetes.io/name: vkprovider
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The image: repository@digest when image.digest is set (pinned; the tag is then only a
label), else repository:tag (tag default: the chart's appVersion). */}}
{{- define "vkprovider.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* Labels of a pod template: the component's labels plus podLabels (which cannot override
the selector labels). (dict "ctx" $ "component" "...") */}}
{{- define "vkprovider.podLabels" -}}
{{- $own := include "vkprovider.labels" . -}}
{{- $ownKeys := $own | fromYaml -}}
{{ $own }}
{{- range $k, $v := .ctx.Values.podLabels }}
{{- if not (hasKey $ownKeys $k) }}
{{ $k }}: {{ $v | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The ServiceAccount of `vkprovider run` (serviceAccount.name, default <name>) and of the
companion (<that>-companion). */}}
{{- define "vkprovider.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "vkprovider.fullname" .) -}}
{{- end -}}
{{- define "vkprovider.companionServiceAccountName" -}}
{{- printf "%s-companion" (include "vkprovider.serviceAccountName" .) -}}
{{- end -}}

{{/* The pod-level securityContext of every pod (podSecurityContext), when not empty. */}}
{{- define "vkprovider.podSecurityContext" -}}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The container securityContext of every process (securityContext; the default is the
restricted Pod Security level). */}}
{{- define "vkprovider.securityContext" -}}
{{- toYaml .Values.securityContext -}}
{{- end -}}

{{/* The label virtual_node (node.name) on every series a ServiceMonitor scrapes; the same label
that vkprovider_leader carries from the process is dropped from its exported_ copy. */}}
{{- define "vkprovider.virtualNodeLabel" -}}
relabelings:
  - targetLabel: virtual_node
    replacement: {{ .Values.node.name | quote }}
metricRelabelings:
  - action: labeldrop
    regex: exported_virtual_node
{{- end -}}

{{/* Where the kubelet API's serving certificate is mounted (kubeletAPI.tls.secretName). */}}
{{- define "vkprovider.servingCertDir" -}}
/etc/vkprovider/serving
{{- end -}}

{{/* Pod placement shared by the Deployments; (dict "ctx" $ "component" "..." "values" ...) */}}
{{- define "vkprovider.placement" -}}
{{- include "vkprovider.podSecurityContext" .ctx }}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .ctx.Values.topologySpread.enabled }}
# replicas on different nodes where possible, so one node going away takes at most one
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "vkprovider.selector" . | nindent 8 }}
{{- end }}
{{- end -}}

{{/* The environment variable holding the API key of a `providers:` entry. */}}
{{- define "vkprovider.apiKeyEnv" -}}
VKP_API_KEY_{{ . | upper | replace "-" "_" }}
{{- end -}}

{{/* The `providers:` list of config.yaml: the mock cloud's entry first, then .Values.providers. */}}
{{- define "vkprovider.providers" -}}
{{- $out := list -}}
{{- if .Values.mockCloud.enabled -}}
{{- $url := printf "http://%s-mock-cloud.%s.svc:%v" (include "vkprovider.fullname" .) .Release.Namespace .Values.mockCloud.port -}}
{{- $out = append $out (dict "name" "mock" "type" "mock" "url" $url) -}}
{{- end -}}
{{- range .Values.providers -}}
{{- $entry := omit . "apiKeySecret" -}}
{{- if .apiKeySecret -}}
{{- $_ := set $entry "api_key_env" (include "vkprovider.apiKeyEnv" .name) -}}
{{- end -}}
{{- $out = append $out $entry -}}
{{- end -}}
{{- toYaml (dict "providers" $out) -}}
{{- end -}}

{{- define "vkprovider.checks" -}}
{{- if and (not .Values.leaderElection.enabled) (or (gt (int .Values.provider.replicas) 1) (gt (int .Values.companion.replicas) 1)) -}}
{{- fail "leaderElection.enabled: false needs provider.replicas and companion.replicas of 1 (two replicas without leader election would both act)" -}}
{{- end -}}
{{- if and .Values.gateway.enabled (not .Values.gateway.runtimeTLSSecret) -}}
{{- fail "gateway.enabled needs gateway.runtimeTLSSecret (the Runtime API is served over mutual TLS only)" -}}
{{- end -}}
{{- if and (eq (toString .Values.provider.probes) "true") (eq (int .Values.provider.metricsPort) 0) -}}
{{- fail "provider.probes needs provider.metricsPort (the probes read /healthz there)" -}}
{{- end -}}
{{- end -}}

{{/* Whether the provider's probes are rendered (see provider.probes in values.yaml). */}}
{{- define "vkprovider.providerProbes" -}}
{{- $p := toString .Values.provider.probes -}}
{{- if and (ne (int .Values.provider.metricsPort) 0) (eq $p "true") -}}
true
{{- end -}}
{{- end -}}

{{/* config.yaml of `vkprovider run` (docs/configuration.md), from the values. */}}
{{- define "vkprovider.providerConfig" -}}
{{- $ns := .Release.Namespace -}}
{{- $node := dict "name" .Values.node.name "kubelet_port" .Values.provider.kubeletPort "taint_value" .Values.node.taintValue -}}
{{- with .Values.node.labels }}{{ $_ := set $node "labels" . }}{{ end -}}
{{- $provider := dict
      "node" $node
      "metrics_port" .Values.provider.metricsPort
      "kubelet_api" (dict "client_ca_file" "/etc/vkprovider/cluster-ca/ca.crt")
      "leader_election" (dict "enabled" .Values.leaderElection.enabled "namespace" $ns)
      "gpu_providers" (dict "enabled" true) -}}
{{- if .Values.kubeletAPI.tls.secretName -}}
{{- $dir := include "vkprovider.servingCertDir" . -}}
{{- $_ := set $provider "tls_cert_file" (printf "%s/tls.crt" $dir) -}}
{{- $_ := set $provider "tls_key_file" (printf "%s/tls.key" $dir) -}}
{{- end -}}
{{- if .Values.gateway.enabled -}}
{{- $g := .Values.gateway -}}
{{- $tls := "/etc/vkprovider/gateway-tls" -}}
{{- $sel := include "vkprovider.selector" (dict "ctx" $ "component" "gateway") | fromYaml -}}
{{- $selector := list -}}
{{- range $k, $v := $sel }}{{ $selector = append $selector (printf "%s=%s" $k $v) }}{{ end -}}
{{- $_ := set $provider "gateway" (dict
      "first_port" $g.firstPort "port_count" $g.portCount "ca_file" $g.edgeCAFile
      "map_dir" "/run/haproxy/maps" "auth_headers" $g.authHeaders
      "pods" (dict "namespace" $ns "selector" (join "," (sortAlpha $selector))
                   "runtime_port" $g.runtimePort)
      "runtime_tls" (dict "cert_file" (printf "%s/tls.crt" $tls)
                          "key_file" (printf "%s/tls.key" $tls)
                          "ca_file" (printf "%s/ca.crt" $tls)
                          "server_name" $g.runtimeServerName)) -}}
{{- end -}}
{{- with .Values.policyLabels }}{{ $_ := set $provider "pods" (dict "policy_labels" .) }}{{ end -}}
{{- $provider = mustMergeOverwrite $provider (include "vkprovider.providers" . | fromYaml) -}}
{{- $provider = mustMergeOverwrite $provider (deepCopy .Values.provider.settings) -}}
{{- toYaml $provider -}}
{{- end -}}

{{/* companion.yaml of `vkprovider descheduler --config` (CompanionSettings), from the values. */}}
{{- define "vkprovider.companionConfig" -}}
{{- $companion := dict
      "node_name" .Values.node.name
      "interval_seconds" .Values.companion.intervalSeconds
      "move_back_interval_seconds" .Values.companion.moveBackIntervalSeconds
      "headroom_gpus" .Values.companion.headroomGPUs
      "metrics_port" .Values.companion.metricsPort
      "leader_election" (dict "enabled" .Values.leaderElection.enabled "namespace" .Release.Namespace) -}}
{{- with .Values.policyLabels }}{{ $_ := set $companion "policy_labels" . }}{{ end -}}
{{- $companion = mustMergeOverwrite $companion (deepCopy .Values.companion.settings) -}}
{{- toYaml $companion -}}
{{- end -}}
