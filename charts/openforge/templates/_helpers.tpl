{{/* Names, labels and images shared by every template. */}}

{{- define "openforge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every object name: RELEASE-NAME, or RELEASE alone when it already
holds the chart name. Kept to 45 characters so that the longest suffix
("-operator-webhook", 17) still fits a 63-character DNS label.
*/}}
{{- define "openforge.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "openforge.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "openforge.labels" -}}
helm.sh/chart: {{ include "openforge.chart" . }}
app.kubernetes.io/name: {{ include "openforge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: openforge
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: (dict "context" $ "component" "operator"). */}}
{{- define "openforge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "openforge.name" .context }}
app.kubernetes.io/instance: {{ .context.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* All labels of one component's objects. */}}
{{- define "openforge.componentLabels" -}}
{{ include "openforge.labels" .context }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
An image reference from {repository, tag, digest}: the digest when set, else
the tag, else the chart's appVersion. (dict "image" .Values.x.image "context" $)
*/}}
{{- define "openforge.image" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .context.Chart.AppVersion .image.tag) }}
{{- end }}
{{- end }}

{{- define "openforge.operator.fullname" -}}
{{- printf "%s-operator" (include "openforge.fullname" .) }}
{{- end }}

{{- define "openforge.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "openforge.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- required "operator.serviceAccount.name is required when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "openforge.webhook.fullname" -}}
{{- printf "%s-operator-webhook" (include "openforge.fullname" .) }}
{{- end }}

{{- define "openforge.trainer.fullname" -}}
{{- printf "%s-trainer" (include "openforge.fullname" .) }}
{{- end }}

{{- define "openforge.collector.fullname" -}}
{{- printf "%s-collector" (include "openforge.fullname" .) }}
{{- end }}

{{- define "openforge.trainer.serviceAccountName" -}}
{{- if .Values.trainer.serviceAccount.create }}
{{- default (include "openforge.trainer.fullname" .) .Values.trainer.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.trainer.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "openforge.trainer.claimName" -}}
{{- default (printf "%s-store" (include "openforge.trainer.fullname" .)) .Values.trainer.persistence.existingClaim }}
{{- end }}

{{/* The collector's in-cluster address, for RolloutJob spec.trainer.endpoint. */}}
{{- define "openforge.collector.endpoint" -}}
{{- printf "%s.%s.svc:%v" (include "openforge.collector.fullname" .) .Release.Namespace .Values.trainer.collector.port }}
{{- end }}

{{/*
The name of the webhook configurations the operator manages (kopf keeps a
mutating and a validating one of the same name); one per release.
*/}}
{{- define "openforge.webhook.configuration" -}}
{{- printf "%s-capture" (include "openforge.fullname" .) }}
{{- end }}

{{/* The operator's webhook flags (operator.webhook.enabled). */}}
{{- define "openforge.webhook.args" -}}
- --webhook
- --webhook-port={{ .Values.operator.webhook.port }}
- --webhook-host={{ include "openforge.webhook.fullname" . }}.{{ .Release.Namespace }}.svc
- --webhook-service={{ .Release.Namespace }}/{{ include "openforge.webhook.fullname" . }}
- --webhook-configuration={{ include "openforge.webhook.configuration" . }}
{{- end }}

{{/* The Secret holding the master key of per-job collector tokens. */}}
{{- define "openforge.collectorTokens.secretName" -}}
{{- default (printf "%s-collector-master-key" (include "openforge.fullname" .)) .Values.collectorTokens.existingSecret }}
{{- end }}

{{/* Where the operator and the collector read the master key. */}}
{{- define "openforge.collectorTokens.file" -}}
/var/run/openforge/collector-master-key/master-key
{{- end }}

{{/* The master key's volume mount (collectorTokens.enabled). */}}
{{- define "openforge.collectorTokens.mount" -}}
- name: collector-master-key
  mountPath: /var/run/openforge/collector-master-key
  readOnly: true
{{- end }}

{{/* The master key's volume: only its key, readable by the pod's group (fsGroup). */}}
{{- define "openforge.collectorTokens.volume" -}}
- name: collector-master-key
  secret:
    secretName: {{ include "openforge.collectorTokens.secretName" . }}
    items:
      - key: {{ .Values.collectorTokens.key }}
        path: master-key
    defaultMode: 0440
{{- end }}
