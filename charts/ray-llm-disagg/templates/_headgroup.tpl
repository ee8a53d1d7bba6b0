{{/* The head group: GCS, dashboard, Serve controller and proxy. No GPUs, num-cpus 0 (no replicas on it). */}}
{{- define "ray-llm-disagg.headGroup" -}}
{{- $V := .Values -}}
serviceType: ClusterIP
rayStartParams:
  {{- toYaml (merge (dict "num-cpus" "0" "dashboard-host" "0.0.0.0") (deepCopy (default dict $V.head.rayStartParams))) | nindent 2 }}
template:
  metadata:
    labels:
      {{- include "ray-llm-disagg.selectorLabels" . | nindent 6 }}
      app.kubernetes.io/component: head
      {{- with include "ray-llm-disagg.userLabels" . }}
      {{- . | nindent 6 }}
      {{- end }}
      {{- with $V.head.podLabels }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    {{- with $V.head.podAnnotations }}
    annotations:
      {{- toYaml . | nindent 6 }}
    {{- end }}
  spec:
    serviceAccountName: {{ include "ray-llm-disagg.serviceAccountName" . }}
    {{- with include "ray-llm-disagg.imagePullSecrets" . }}
    imagePullSecrets:
      {{- . | nindent 6 }}
    {{- end }}
    {{- with $V.head.nodeSelector }}
    nodeSelector:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $V.head.tolerations }}
    tolerations:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $V.head.affinity }}
    affinity:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    containers:
      - name: ray-head
        image: {{ include "ray-llm-disagg.image" . }}
        imagePullPolicy: {{ $V.image.pullPolicy }}
        ports:
          - name: gcs-server
            containerPort: 6379
          - name: dashboard
            containerPort: 8265
          - name: client
            containerPort: 10001
          - name: serve
            containerPort: {{ int $V.serve.port }}
          - name: metrics
            containerPort: 8080
        {{- $env := include "ray-llm-disagg.commonEnv" . | trim }}
        {{- if or $env $V.head.extraEnv }}
        env:
          {{- with $env }}
          {{- . | nindent 10 }}
          {{- end }}
          {{- with $V.head.extraEnv }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        {{- end }}
        resources:
          {{- toYaml (default dict $V.head.resources) | nindent 10 }}
        volumeMounts:
          - name: dshm
            mountPath: /dev/shm
          {{- with $V.head.extraVolumeMounts }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
    volumes:
      - name: dshm
        emptyDir:
          medium: Memory
          sizeLimit: {{ $V.head.shmSizeLimit }}
      {{- with $V.head.extraVolumes }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
{{- end -}}
