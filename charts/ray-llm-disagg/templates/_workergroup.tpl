{{/*
ONE worker group, rendered for each role ({root, role}; role is "prefill" or "decode").
The roles differ only in their values block (.Values.prefill / .Values.decode); nothing here is
role-specific except the name and the Ray node label that carries it.
*/}}
{{- define "ray-llm-disagg.workerGroup" -}}
{{- $root := .root -}}
{{- $role := .role -}}
{{- $V := $root.Values -}}
{{- $v := index $V $role -}}
{{- $ctx := dict "root" $root "role" $role -}}
- groupName: {{ $role }}
  numOfHosts: {{ include "ray-llm-disagg.numOfHosts" $ctx }}
  {{- if $v.autoscaling.enabled }}
  replicas: {{ int $v.autoscaling.minReplicas }}
  minReplicas: {{ int $v.autoscaling.minReplicas }}
  maxReplicas: {{ int $v.autoscaling.maxReplicas }}
  {{- with $v.idleTimeoutSeconds }}
  idleTimeoutSeconds: {{ int . }}
  {{- end }}
  {{- else }}
  replicas: {{ int $v.replicas }}
  minReplicas: {{ int $v.replicas }}
  maxReplicas: {{ int $v.replicas }}
  {{- end }}
  # Ray node labels (KubeRay >= 1.5; also pod labels): the app pins this role's placement groups to them.
  labels:
    {{ $V.placement.roleLabelKey }}: {{ $role }}
    {{- with $v.rayLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $v.rayStartParams }}
  rayStartParams:
    {{- toYaml . | nindent 4 }}
  {{- else }}
  rayStartParams: {}
  {{- end }}
  template:
    metadata:
      labels:
        {{- include "ray-llm-disagg.selectorLabels" $root | nindent 8 }}
        app.kubernetes.io/component: {{ $role }}
        {{ $V.placement.roleLabelKey }}: {{ $role }}
        {{- with include "ray-llm-disagg.userLabels" $root }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with $v.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $v.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ include "ray-llm-disagg.serviceAccountName" $root }}
      {{- with include "ray-llm-disagg.imagePullSecrets" $root }}
      imagePullSecrets:
        {{- . | nindent 8 }}
      {{- end }}
      {{- with $v.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with include "ray-llm-disagg.workerAffinity" $ctx }}
      affinity:
        {{- . | nindent 8 }}
      {{- end }}
      containers:
        - name: ray-worker
          image: {{ include "ray-llm-disagg.image" $root }}
          imagePullPolicy: {{ $V.image.pullPolicy }}
          {{- with include "ray-llm-disagg.workerEnv" $ctx | trim }}
          env:
            {{- . | nindent 12 }}
          {{- end }}
          {{- if include "ray-llm-disagg.explicitSideChannel" $root }}
          ports:
            - name: nixl-side
              containerPort: {{ int $v.sideChannelPort }}
              protocol: TCP
          {{- end }}
          resources:
            {{- include "ray-llm-disagg.workerResources" $ctx | nindent 12 }}
          {{- $privileged := and $V.efa.enabled $V.efa.privileged }}
          {{- if or $V.ipcLock $privileged }}
          securityContext:
            {{- if $privileged }}
            privileged: true
            {{- end }}
            {{- if $V.ipcLock }}
            capabilities:
              add: [IPC_LOCK]
            {{- end }}
          {{- end }}
          volumeMounts:
            - name: dshm
              mountPath: /dev/shm
            {{- with $v.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        - name: dshm
          emptyDir:
            medium: Memory
            sizeLimit: {{ $v.shmSizeLimit }}
        {{- with $v.extraVolumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
{{- end -}}
