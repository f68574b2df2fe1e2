{{/* Names, labels and the pieces the gateway and the node-agents share. Names stay within 40 characters:
     a StatefulSet name ("<name>-node-agent") must leave room in its 63-character revision label. */}}

{{- define "kvroute.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvroute.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: include "kvroute.selector" (list . "gateway") */}}
{{- define "kvroute.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "kvroute.image" -}}
{{- $root := index . 0 -}}
{{- printf "%s/%s:%s" $root.Values.image.repository (index . 1) ($root.Values.image.tag | default $root.Chart.AppVersion) -}}
{{- end -}}

{{- define "kvroute.agentsHost" -}}
{{- printf "%s-node-agent.%s.svc.%s" (include "kvroute.fullname" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{- define "kvroute.tokenizer" -}}
{{- if ne .Values.gateway.tokenizer "auto" -}}
{{- .Values.gateway.tokenizer -}}
{{- else if eq .Values.model.path "tiny-random" -}}
builtin
{{- else -}}
{{- .Values.model.path -}}
{{- end -}}
{{- end -}}

{{- define "kvroute.modelFile" -}}
{{- ne .Values.model.path "tiny-random" -}}
{{- end -}}

{{/* Pod-level security context of the kvroute pods (the images' user is 10001). */}}
{{- define "kvroute.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "kvroute.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* The init container that puts the model file into /models (when the model is a file to download). */}}
{{- define "kvroute.modelInit" -}}
{{- if and (eq (include "kvroute.modelFile" .) "true") .Values.model.download.enabled }}
- name: fetch-model
  image: {{ .Values.model.download.image }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: [python3, /etc/kvroute/fetch-model.py]
  env:
    - name: HOME
      value: /tmp
  envFrom:
    - configMapRef:
        name: {{ include "kvroute.fullname" . }}-config
  securityContext:
    {{- include "kvroute.containerSecurityContext" . | nindent 4 }}
  resources:
    requests: {cpu: 100m, memory: 128Mi}
    limits: {memory: 512Mi}
  volumeMounts:
    - {name: models, mountPath: /models}
    - {name: tmp, mountPath: /tmp}
    - {name: fetch-model, mountPath: /etc/kvroute}
{{- end }}
{{- end -}}

{{/* Volumes every kvroute pod has: /tmp, the model and its fetch script. */}}
{{- define "kvroute.volumes" -}}
- name: tmp
  emptyDir: {}
{{- if eq (include "kvroute.modelFile" .) "true" }}
- name: models
  {{- if .Values.model.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.model.existingClaim }}
    readOnly: {{ not .Values.model.download.enabled }}
  {{- else }}
  emptyDir:
    sizeLimit: {{ .Values.model.emptyDirSizeLimit }}
  {{- end }}
- name: fetch-model
  configMap:
    name: {{ include "kvroute.fullname" . }}-fetch-model
    items: [{key: fetch-model.py, path: fetch-model.py}]
{{- end }}
{{- end -}}

{{- define "kvroute.volumeMounts" -}}
- {name: tmp, mountPath: /tmp}
{{- if eq (include "kvroute.modelFile" .) "true" }}
- {name: models, mountPath: /models, readOnly: true}
{{- end }}
{{- end -}}

{{/* Refuses contradictory values before anything renders. */}}
{{- define "kvroute.validate" -}}
{{- if and .Values.redis.enabled (or .Values.redis.url .Values.redis.clusterNodes) -}}
{{- fail "redis.url and redis.clusterNodes are for an external Redis: set redis.enabled=false" -}}
{{- end -}}
{{- if and .Values.redis.url .Values.redis.clusterNodes -}}
{{- fail "give redis.url (standalone) or redis.clusterNodes (cluster), not both" -}}
{{- end -}}
{{- if le (int .Values.gateway.terminationGracePeriodSeconds) (add .Values.gateway.shutdownGraceSecs .Values.gateway.preStopSleepSecs | int) -}}
{{- fail "gateway.terminationGracePeriodSeconds must exceed gateway.shutdownGraceSecs + gateway.preStopSleepSecs" -}}
{{- end -}}
{{- end -}}
