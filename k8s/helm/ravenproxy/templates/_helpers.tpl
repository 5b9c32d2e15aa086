{{/* The image every ravenproxy container runs. */}}
{{- define "ravenproxy.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Labels of one component: also its selector (name + component, as Raven's users expect). */}}
{{- define "ravenproxy.labels" -}}
{app.kubernetes.io/name: ravenproxy, app.kubernetes.io/component: {{ . }}}
{{- end -}}

{{/* "host:port" of a listen address on all interfaces. */}}
{{- define "ravenproxy.any" -}}
:{{ . }}
{{- end -}}

{{/* The IPsec PSK Secret's name: the operator's (l3.pskSecret) or the chart's. */}}
{{- define "ravenproxy.pskSecret" -}}
{{ .Values.l3.pskSecret | default "ravenproxy-ipsec-psk" }}
{{- end -}}

{{/* The agent's args (the edge agent DaemonSet, and the L3 DaemonSet's agent --l3). */}}
{{- define "ravenproxy.agentArgs" -}}
- agent
- --node-name=$(NODE_NAME)
{{- range .Values.agent.serverAddresses }}
- --server-addr={{ . }}
{{- else }}
- --discover-servers
{{- end }}
{{- if eq .Values.certs.mode "csr" }}
- --cert-dir=/var/lib/ravenproxy/agent-certs
- --cert-lifetime={{ .Values.certs.lifetime }}
{{- else }}
- --ca-file=/etc/ravenproxy/certs/ca.crt
- --cert-file=/etc/ravenproxy/certs/$(NODE_NAME).crt
- --key-file=/etc/ravenproxy/certs/$(NODE_NAME).key
{{- end }}
- --kube-model
{{- if .Values.egress.enabled }}
- --allow-pods
{{- end }}
{{- range .Values.agent.metricsPorts }}
- --metrics-port={{ . }}
{{- end }}
- --metrics-addr=127.0.0.1:{{ .Values.ports.metrics }}
{{- end -}}

{{/* The agent's certificate volume: a hostPath kept on the node (csr) or the Secret. */}}
{{- define "ravenproxy.agentCertMount" -}}
{{- if eq .Values.certs.mode "csr" -}}
- {name: certs, mountPath: /var/lib/ravenproxy/agent-certs}
{{- else -}}
- {name: certs, mountPath: /etc/ravenproxy/certs, readOnly: true}
{{- end -}}
{{- end -}}

{{- define "ravenproxy.agentCertVolume" -}}
{{- if eq .Values.certs.mode "csr" -}}
- name: certs
  hostPath: {path: /var/lib/ravenproxy/agent-certs, type: DirectoryOrCreate}
{{- else -}}
- name: certs
  secret: {secretName: {{ .Values.certs.agentSecret }}, defaultMode: 0400}
{{- end -}}
{{- end -}}

{{/* NODE_NAME from the downward API. */}}
{{- define "ravenproxy.nodeEnv" -}}
- name: NODE_NAME
  valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
{{- end -}}
