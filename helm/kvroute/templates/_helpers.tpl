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
{{- else if eq (include "kvroute.vllm" .) "true" -}}
{{- include "kvroute.modelDir" . }}/tokenizer.json
{{- else if eq .Values.model.path "tiny-random" -}}
builtin
{{- else -}}
{{- .Values.model.path -}}
{{- end -}}
{{- end -}}

{{/* The builtin engine serves a model file (model.path), unless it is tiny-random. */}}
{{- define "kvroute.modelFile" -}}
{{- ne .Values.model.path "tiny-random" -}}
{{- end -}}

{{/* "true" when the node-agents run beside vLLM (nodeAgent.engine=vllm) instead of computing themselves. */}}
{{- define "kvroute.vllm" -}}
{{- eq (.Values.nodeAgent.engine | default "builtin") "vllm" -}}
{{- end -}}

{{/* vLLM mode: "true" when nodeAgent.vllm.model is a Hugging Face id (fetched), not a directory under /models. */}}
{{- define "kvroute.vllmModelFromHub" -}}
{{- not (hasPrefix "/" .Values.nodeAgent.vllm.model) -}}
{{- end -}}

{{/* vLLM mode: the model's directory in Hugging Face layout, as the agents, vLLM and the gateways see it. */}}
{{- define "kvroute.modelDir" -}}
{{- if eq (include "kvroute.vllmModelFromHub" .) "true" -}}
{{- printf "/models/%s" .Values.nodeAgent.vllm.model -}}
{{- else -}}
{{- .Values.nodeAgent.vllm.model | trimSuffix "/" -}}
{{- end -}}
{{- end -}}

{{/* vLLM mode: the name vLLM serves the model under (and the agents ask it for). */}}
{{- define "kvroute.servedModelName" -}}
{{- if .Values.nodeAgent.vllm.servedModelName -}}
{{- .Values.nodeAgent.vllm.servedModelName -}}
{{- else if eq (include "kvroute.vllmModelFromHub" .) "true" -}}
{{- .Values.nodeAgent.vllm.model -}}
{{- else -}}
{{- base (include "kvroute.modelDir" .) -}}
{{- end -}}
{{- end -}}

{{/* vLLM mode: the --kv-events-config of vLLM (ZMQ publisher and replay socket; vLLM binds wildcard endpoints). */}}
{{- define "kvroute.vllmKvEventsConfig" -}}
{{- $vllm := .Values.nodeAgent.vllm -}}
{{- dict "enable_kv_cache_events" true "publisher" "zmq" "endpoint" (printf "tcp://*:%d" (int $vllm.kvEventsPort)) "replay_endpoint" (printf "tcp://*:%d" (int $vllm.kvReplayPort)) "topic" "" | toJson -}}
{{- end -}}

{{/* vLLM mode: a probe of vLLM's GET /health from inside its container. */}}
{{- define "kvroute.vllmHealthProbe" -}}
exec:
  command: [python3, -c, "import urllib.request; urllib.request.urlopen('http://127.0.0.1:{{ .Values.nodeAgent.vllm.port }}/health', timeout=4)"]
timeoutSeconds: 5
{{- end -}}

{{/* "true" when the pods mount a model volume at /models. */}}
{{- define "kvroute.modelVolume" -}}
{{- or (eq (include "kvroute.vllm" .) "true") (eq (include "kvroute.modelFile" .) "true") -}}
{{- end -}}

{{/* "true" when an init container fetches the model into /models. */}}
{{- define "kvroute.modelFetch" -}}
{{- if eq (include "kvroute.vllm" .) "true" -}}
{{- and .Values.model.download.enabled (eq (include "kvroute.vllmModelFromHub" .) "true") -}}
{{- else -}}
{{- and .Values.model.download.enabled (eq (include "kvroute.modelFile" .) "true") -}}
{{- end -}}
{{- end -}}

{{/* "true" when the fetch script's ConfigMap is rendered and mounted (builtin: whenever there is a model file). */}}
{{- define "kvroute.fetchScript" -}}
{{- if eq (include "kvroute.vllm" .) "true" -}}
{{- include "kvroute.modelFetch" . -}}
{{- else -}}
{{- include "kvroute.modelFile" . -}}
{{- end -}}
{{- end -}}

{{/* "true" when the chart deploys its own Redis (redis.enabled): only agents of the builtin engine have a Redis tier. */}}
{{- define "kvroute.bundledRedis" -}}
{{- and (ne (include "kvroute.vllm" .) "true") .Values.redis.enabled -}}
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

{{/* The init container that puts the model into /models (when it is to be fetched):
     include "kvroute.modelInit" (list . FILES). FILES, for a Hugging Face model: `all` (an agent pod, for vLLM)
     or `tokenizer` (a gateway pod: the tokenizer and config files only). */}}
{{- define "kvroute.modelInit" -}}
{{- $root := index . 0 -}}
{{- with $root -}}
{{- if eq (include "kvroute.modelFetch" .) "true" }}
- name: fetch-model
  image: {{ .Values.model.download.image }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: [python3, /etc/kvroute/fetch-model.py]
  env:
    - name: HOME
      value: /tmp
    {{- if eq (include "kvroute.vllm" .) "true" }}
    - name: MODEL_FILES
      value: {{ index $ 1 }}
    {{- with .Values.model.download.hfTokenSecret }}
    - name: HF_TOKEN
      valueFrom:
        secretKeyRef: {name: {{ . | quote }}, key: {{ $root.Values.model.download.hfTokenSecretKey | quote }}}
    {{- end }}
    {{- end }}
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
{{- end }}
{{- end -}}

{{/* Volumes every kvroute pod has: /tmp, the model and its fetch script. */}}
{{- define "kvroute.volumes" -}}
- name: tmp
  emptyDir: {}
{{- if eq (include "kvroute.modelVolume" .) "true" }}
- name: models
  {{- if .Values.model.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.model.existingClaim }}
    readOnly: {{ ne (include "kvroute.modelFetch" .) "true" }}
  {{- else }}
  emptyDir:
    sizeLimit: {{ .Values.model.emptyDirSizeLimit }}
  {{- end }}
{{- end }}
{{- if eq (include "kvroute.fetchScript" .) "true" }}
- name: fetch-model
  configMap:
    name: {{ include "kvroute.fullname" . }}-fetch-model
    items: [{key: fetch-model.py, path: fetch-model.py}]
{{- end }}
{{- end -}}

{{- define "kvroute.volumeMounts" -}}
- {name: tmp, mountPath: /tmp}
{{- if eq (include "kvroute.modelVolume" .) "true" }}
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
{{- if eq (include "kvroute.vllm" .) "true" -}}
{{- if gt (int .Values.nodeAgent.gpus) 0 -}}
{{- fail "nodeAgent.gpus is the builtin engine's: with nodeAgent.engine=vllm the GPUs are vLLM's, set nodeAgent.vllm.gpus" -}}
{{- end -}}
{{- if ne (int .Values.blockSize) 16 -}}
{{- fail "with nodeAgent.engine=vllm the agents present blocks of 16 tokens: blockSize must be 16 (nodeAgent.vllm.blockSize is vLLM's own, a multiple of 16)" -}}
{{- end -}}
{{- if or .Values.redis.url .Values.redis.clusterNodes -}}
{{- fail "agents beside vLLM have no Redis tier: leave redis.url and redis.clusterNodes empty with nodeAgent.engine=vllm" -}}
{{- end -}}
{{- if and (ne (include "kvroute.modelFetch" .) "true") (not .Values.model.existingClaim) -}}
{{- fail "nothing would put nodeAgent.vllm.model into /models: set model.existingClaim to a PersistentVolumeClaim that holds it (a directory, or a Hugging Face id with model.download.enabled=false), or fetch a Hugging Face id (model.download.enabled)" -}}
{{- end -}}
{{- end -}}
{{- end -}}
