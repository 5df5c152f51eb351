{{/* Names, labels and the pod pieces every manent container shares. */}}

{{- define "manent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "manent.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "manent.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "manent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "manent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "manent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "manent.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "manent.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "manent.databaseSecretName" -}}
{{- default (printf "%s-database" (include "manent.fullname" .)) .Values.database.existingSecret -}}
{{- end -}}

{{- define "manent.databaseSecretKey" -}}
{{- if .Values.database.existingSecret -}}{{ .Values.database.existingSecretKey }}{{- else -}}url{{- end -}}
{{- end -}}

{{- define "manent.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}

{{/* Environment shared by the API and the workers: the database URL from its Secret. */}}
{{- define "manent.commonEnv" -}}
- name: MANENT__DATABASE__URL
  valueFrom:
    secretKeyRef:
      name: {{ include "manent.databaseSecretName" . }}
      key: {{ include "manent.databaseSecretKey" . }}
- name: MANENT__ENVIRONMENTS__SOURCE
  value: /etc/manent/environments
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Changing manent.yml or the environment files rolls the pods. */}}
{{- define "manent.checksums" -}}
checksum/config: {{ toYaml .Values.config | sha256sum }}
checksum/environments: {{ toYaml .Values.environments | sha256sum }}
{{- end -}}

{{- define "manent.volumeMounts" -}}
- name: config
  mountPath: /etc/manent/manent.yml
  subPath: manent.yml
  readOnly: true
- name: environments
  mountPath: /etc/manent/environments
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "manent.volumes" -}}
- name: config
  configMap:
    name: {{ include "manent.fullname" . }}-config
- name: environments
{{- if .Values.environments.volume }}
{{ toYaml .Values.environments.volume | indent 2 }}
{{- else if .Values.environments.existingConfigMap }}
  configMap:
    name: {{ .Values.environments.existingConfigMap }}
    {{- with .Values.environments.items }}
    items:
{{ toYaml . | indent 6 }}
    {{- end }}
{{- else }}
  configMap:
    name: {{ include "manent.fullname" . }}-environments
    {{- if .Values.environments.files }}
    items:
    {{- range $path, $_ := .Values.environments.files }}
      - key: {{ include "manent.environmentKey" $path }}
        path: {{ $path }}
    {{- end }}
    {{- end }}
{{- end }}
- name: tmp
  emptyDir: {}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* A ConfigMap key for an environment file's path (keys cannot hold a `/`). */}}
{{- define "manent.environmentKey" -}}
{{- . | replace "/" "." -}}
{{- end -}}
