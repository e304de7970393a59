{{- define "snapshot.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "snapshot.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "snapshot.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "snapshot.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "snapshot.labels" -}}
app.kubernetes.io/name: {{ include "snapshot.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "snapshot.selector" -}}
app.kubernetes.io/name: {{ include "snapshot.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "snapshot.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "snapshot.webhookName" -}}
{{ include "snapshot.fullname" . }}-webhook
{{- end -}}

{{- /* how the webhook gets its TLS: chart (a generated Secret, one CA), secret (yours), or
certManager (yours, CA injected by cert-manager) */ -}}
{{- define "snapshot.tlsMode" -}}
{{- if .Values.webhook.tls.secretName -}}{{- if .Values.webhook.tls.certManagerInjectFrom -}}certManager{{- else -}}secret{{- end -}}{{- else -}}chart{{- end -}}
{{- end -}}

{{- define "snapshot.tlsSecret" -}}
{{- .Values.webhook.tls.secretName | default (printf "%s-webhook-tls" (include "snapshot.fullname" .)) -}}
{{- end -}}

{{- define "snapshot.signerName" -}}
{{ include "snapshot.fullname" . }}-signer
{{- end -}}

{{- /* where agents reach the signer: its fixed ClusterIP when one is set (clusters without
DNS for Services), else its Service's name */ -}}
{{- define "snapshot.signerURL" -}}
https://{{ .Values.signer.clusterIP | default (printf "%s.%s.svc" (include "snapshot.signerName" .) .Release.Namespace) }}
{{- end -}}

{{- define "snapshot.signingSecret" -}}
{{- .Values.signing.secretName | default (printf "%s-signing" (include "snapshot.fullname" .)) -}}
{{- end -}}


{{/* The OCI settings the agent (push) and the shim it installs (pull) share; the
     credentials are each one's own (snapshot.ociAuthArg). */}}
{{- define "snapshot.ociArgs" -}}
- --oci-plain-http={{ join "," .Values.storage.oci.plainHTTP }}
- --oci-cache-max-gb={{ .Values.storage.oci.cacheMaxGB }}
{{- end -}}

{{/* The credentials of one container: "push" (the agent: storage.oci.pushSecret, else the
     pull secret) or "pull" (the shim's, copied onto the node: storage.oci.pullSecret). */}}
{{- define "snapshot.ociAuthMount" -}}
{{- $s := .root.Values.storage.oci -}}
{{- if and (eq .role "push") $s.pushSecret -}}/oci-push{{- else if $s.pullSecret -}}/oci-auth{{- end -}}
{{- end -}}

