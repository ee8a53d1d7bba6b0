#!/usr/bin/env bash
# A local Kubernetes control plane for the chart tests, on 127.0.0.1 only:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler (real, built by hack/toolchain.sh),
# kwok (fake kubelets for the nodes below) and the KubeRay operator (out of cluster).
#
#   hack/cluster.sh up [--nodes prefill=4,decode=2]          start (or reuse a healthy one), size the node pools
#   hack/cluster.sh nodes prefill=1,decode=1                 resize node pools of the running cluster
#   hack/cluster.sh status                                   components, nodes, CRDs
#   hack/cluster.sh env                                      print `export KUBECONFIG=...` and PATH
#   hack/cluster.sh down                                     stop everything it started, remove the state dir
#
# Node pools come from hack/k8s/nodes/<pool>.yaml; sizes from --nodes or RLD_NODES ("prefill=1 decode=1"), on top of
# the defaults cpu=2 prefill=4 decode=2 prefill-p5en=1 decode-p5en=1.
# State (pids, logs, kubeconfig, etcd data): ${RLD_STATE:-/tmp/ray-llm-disagg-cluster}.
# Ports: ${RLD_PORT_BASE:-26400} + 1..6 on 127.0.0.1.
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

STATE="${RLD_STATE:-/tmp/ray-llm-disagg-cluster}"
KC="$STATE/kubeconfig"
BIN="$RLD_CACHE/bin"
NODES_DIR="$RLD_ROOT/hack/k8s/nodes"
PORT_BASE="${RLD_PORT_BASE:-26400}"
ETCD_PORT=$((PORT_BASE + 1)) ETCD_PEER_PORT=$((PORT_BASE + 2)) API_PORT=$((PORT_BASE + 3))
KCM_PORT=$((PORT_BASE + 4)) SCHED_PORT=$((PORT_BASE + 5)) OPERATOR_PROBE_PORT=$((PORT_BASE + 6))
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok ray-operator)
DEFAULT_NODES="cpu=2 prefill=4 decode=2 prefill-p5en=1 decode-p5en=1"
WAIT_S="${RLD_WAIT_S:-90}"
SERVICE_CIDR="${RLD_SERVICE_CIDR:-127.96.0.0/16}"   # ClusterIPs are never dialled here; loopback anyway
TEMPLATE="$RLD_CACHE/cluster-template/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kuberay-$KUBERAY_VERSION-svc-${SERVICE_CIDR//[.\/]/_}"

export PATH="$BIN:$PATH"
kc() { kubectl --kubeconfig "$KC" "$@"; }

# --- processes ----------------------------------------------------------------------------------

# start NAME ARGS...: run $BIN/NAME in its own session, log to $STATE/logs/NAME.log, remember its pid.
start() {
  local name="$1"; shift
  setsid "$BIN/$name" "$@" >"$STATE/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$STATE/pids/$name"
}

# pid_of NAME: the pid of our running NAME, or fail (a recycled pid running something else does not count).
pid_of() {
  local pid exe
  pid="$(cat "$STATE/pids/$1" 2>/dev/null)" || return 1
  exe="$(readlink "/proc/$pid/exe" 2>/dev/null)" || return 1
  [ "$exe" = "$(readlink -f "$BIN/$1")" ] && echo "$pid"
}

stop() {
  local name="$1" pid i
  pid="$(pid_of "$name")" || { rm -f "$STATE/pids/$name"; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$pid" 2>/dev/null && { rld::log "$name (pid $pid) ignored SIGTERM for 10s, sending SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; }
  rm -f "$STATE/pids/$name"
}

# wait_ready NAME WHAT CMD...: wait for CMD; on timeout show NAME's log and die.
wait_ready() {
  local name="$1" what="$2"; shift 2
  if ! rld::wait_for "$WAIT_S" "$what" "$@"; then
    pid_of "$name" >/dev/null || rld::log "$name is not running (exited early)"
    rld::log "last lines of $STATE/logs/$name.log:"; tail -n 25 "$STATE/logs/$name.log" >&2 || true
    rld::die "$name did not become ready ($what). Full log: $STATE/logs/$name.log. Fix the cause, then: hack/cluster.sh down && hack/cluster.sh up"
  fi
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# --- one-time setup: keys, certs, token, kubeconfig -----------------------------------------------

write_pki() {
  local p="$STATE/pki" token
  mkdir -p "$p"
  # EC P-256 keys: generated in milliseconds (RSA takes seconds on a busy machine); the API server signs
  # service-account tokens with ES256.
  ec() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
  ec "$p/sa.key" && openssl pkey -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
  ec "$p/ca.key" && openssl req -x509 -new -key "$p/ca.key" -days 365 -subj "/CN=ray-llm-disagg-local-ca" -out "$p/ca.crt" 2>/dev/null
  ec "$p/apiserver.key" && openssl req -new -key "$p/apiserver.key" -subj "/CN=kube-apiserver" -out "$p/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc\n' > "$p/san.ext"
  openssl x509 -req -in "$p/apiserver.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial -days 365 \
    -extfile "$p/san.ext" -out "$p/apiserver.crt" 2>/dev/null || rld::die "openssl failed to create the local PKI in $p"
  token="$(openssl rand -hex 16)"
  echo "$token,admin,admin,system:masters" > "$p/tokens.csv"
  cat > "$KC" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: ray-llm-disagg-local
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(base64 -w0 < "$p/ca.crt")
users:
- name: admin
  user:
    token: $token
contexts:
- name: ray-llm-disagg-local
  context: {cluster: ray-llm-disagg-local, user: admin}
current-context: ray-llm-disagg-local
EOF
}

# --- components -----------------------------------------------------------------------------------

# shellcheck disable=SC2120  # args come through rld::timed
start_etcd() {
  start etcd "$@" --name rld --data-dir "$STATE/etcd" --unsafe-no-fsync \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "rld=http://127.0.0.1:$ETCD_PEER_PORT"
  wait_ready etcd "etcd health on 127.0.0.1:$ETCD_PORT" \
    bash -c "curl -sf http://127.0.0.1:$ETCD_PORT/health | grep -q '\"health\":\"true\"'"
}

start_apiserver() {
  local p="$STATE/pki"
  # --endpoint-reconciler-type=none: the `kubernetes` Service would get a loopback endpoint, which is invalid.
  start kube-apiserver --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
    --tls-cert-file "$p/apiserver.crt" --tls-private-key-file "$p/apiserver.key" --client-ca-file "$p/ca.crt" \
    --token-auth-file "$p/tokens.csv" --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$p/sa.pub" --service-account-signing-key-file "$p/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" --endpoint-reconciler-type none \
    --allow-privileged=true --profiling=false --request-timeout 3m \
    --kubelet-preferred-address-types InternalIP,Hostname
  wait_ready kube-apiserver "kube-apiserver /readyz on https://127.0.0.1:$API_PORT" kc get --raw /readyz
}

# Flags shared by the controller manager and the scheduler (serve /healthz on loopback, no leader election).
component_flags() {
  echo --kubeconfig "$KC" --authentication-kubeconfig "$KC" --authorization-kubeconfig "$KC" \
    --leader-elect=false --bind-address 127.0.0.1 --secure-port "$1"
}

start_controller_manager() {
  # shellcheck disable=SC2046
  start kube-controller-manager $(component_flags "$KCM_PORT") --use-service-account-credentials=false \
    --service-account-private-key-file "$STATE/pki/sa.key" --root-ca-file "$STATE/pki/ca.crt"
  wait_ready kube-controller-manager "kube-controller-manager /healthz on 127.0.0.1:$KCM_PORT" \
    curl -skf "https://127.0.0.1:$KCM_PORT/healthz"
}

start_scheduler() {
  # shellcheck disable=SC2046
  start kube-scheduler $(component_flags "$SCHED_PORT")
  wait_ready kube-scheduler "kube-scheduler /healthz on 127.0.0.1:$SCHED_PORT" curl -skf "https://127.0.0.1:$SCHED_PORT/healthz"
}

start_kwok() {
  local st; st="$(rld::moddir "sigs.k8s.io/kwok@$KWOK_VERSION")/kustomize/stage"
  # kwok >= 0.8 has no built-in stages: node init + lease heartbeat, pod ready/complete(Job)/delete from its
  # module, and ours for helm test hooks. Pod IPs come from each node's podCIDR (127/8), --cidr is a fallback.
  start kwok --kubeconfig "$KC" --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --cidr 127.200.0.0/16 --node-ip 127.0.0.1 --node-lease-duration-seconds 40 \
    -c "$st/node/fast/node-initialize.yaml" -c "$st/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
    -c "$st/pod/fast/pod-ready.yaml" -c "$st/pod/fast/pod-complete.yaml" -c "$st/pod/fast/pod-delete.yaml" \
    -c "$RLD_ROOT/hack/k8s/kwok/pod-helm-test-complete.yaml"
  wait_ready kwok "kwok running" bash -c "sleep 1; kill -0 $(cat "$STATE/pids/kwok")"
}

install_crds() {
  local crds; crds="$(rld::moddir "github.com/ray-project/kuberay/ray-operator@$KUBERAY_VERSION")/config/crd/bases"
  # The CRDs are ~1 MB each: too big for client-side apply's last-applied annotation. Server-side apply is
  # idempotent, so retry: on a busy 2-core machine the API server can need a minute per CRD (OpenAPI build).
  local try
  for try in 1 2 3; do
    kc apply --server-side --force-conflicts -f "$crds" >/dev/null && break
    [ "$try" -lt 3 ] || rld::die "installing the KubeRay CRDs from $crds failed 3 times (see kubectl output above; API server log: $STATE/logs/kube-apiserver.log)"
    rld::log "applying the KubeRay CRDs failed (attempt $try/3; API server busy?), retrying"
  done
  WAIT_S=$((WAIT_S * 2)) wait_ready kube-apiserver "KubeRay CRDs Established" \
    kc wait --for condition=Established --timeout 5s crd/rayclusters.ray.io crd/rayjobs.ray.io crd/rayservices.ray.io
}

# Creating the ~3 MB of KubeRay CRDs costs the API server a lot of CPU (1-2 min on a busy 2-core machine),
# restarting with them already stored does not. So the first `up` stores them once in an etcd data dir
# that later clusters start from (a copy).
make_template() {
  rld::log "creating the etcd template with the KubeRay CRDs: $TEMPLATE (delete it to rebuild)"
  start_etcd
  start_apiserver
  install_crds
  stop kube-apiserver
  stop etcd
  rm -rf "$TEMPLATE.tmp" && mkdir -p "$TEMPLATE.tmp" && mv "$STATE/etcd" "$TEMPLATE.tmp/etcd" &&
    rm -rf "$TEMPLATE" && mv "$TEMPLATE.tmp" "$TEMPLATE" || rld::die "could not store the etcd template in $TEMPLATE"
}

# ensure_crds: the CRDs come with the template; install them only if they are missing.
ensure_crds() {
  kc wait --for condition=Established --timeout 30s crd/rayclusters.ray.io crd/rayjobs.ray.io crd/rayservices.ray.io \
    >/dev/null 2>&1 || install_crds
}

start_operator() {
  # --use-kubernetes-proxy: reach Ray dashboards through the API server (127.0.0.1) instead of resolving
  # *.svc.cluster.local with the host's DNS server.
  KUBECONFIG="$KC" start ray-operator --enable-leader-election=false --use-kubernetes-proxy \
    --metrics-addr 0 --health-probe-bind-address "127.0.0.1:$OPERATOR_PROBE_PORT" --log-stdout-encoder console
  wait_ready ray-operator "KubeRay operator /readyz on 127.0.0.1:$OPERATOR_PROBE_PORT" \
    curl -sf "http://127.0.0.1:$OPERATOR_PROBE_PORT/readyz"
}

# --- node pools -------------------------------------------------------------------------------------

pools() { local f; for f in "$NODES_DIR"/*.yaml; do basename "$f" .yaml; done; }

# desired_nodes SPEC: "pool=count ..." (defaults, then SPEC) -> lines "pool index"
desired_nodes() {
  local -A count=() ; local kv pool i
  for kv in $DEFAULT_NODES ${1//,/ }; do
    pool="${kv%%=*}"
    [ -f "$NODES_DIR/$pool.yaml" ] || rld::die "unknown node pool '$pool' in '$1': pools are $(pools | tr '\n' ' ')(hack/k8s/nodes/*.yaml)"
    [[ "${kv#*=}" =~ ^[0-9]+$ ]] || rld::die "node count for '$pool' must be a number, got '${kv#*=}'"
    count[$pool]="${kv#*=}"
  done
  for pool in $(pools); do
    for ((i = 0; i < ${count[$pool]:-0}; i++)); do echo "$pool $i"; done
  done
}

# render_node POOL INDEX: the Node manifest; pool k of the sorted list gets pod CIDR 127.(100+k).INDEX.0/24.
render_node() {
  local k; k="$(pools | grep -nx "$1" | cut -d: -f1)"
  sed -e "s/__NAME__/$1-$2/g" -e "s/__NODE_IP__/127.10.$k.$(($2 + 1))/g" \
      -e "s#__POD_CIDR__#127.$((100 + k)).$2.0/24#g" "$NODES_DIR/$1.yaml"
}

reconcile_nodes() {
  local spec="$1" want have manifests n refs
  want="$(desired_nodes "$spec" | while read -r pool i; do echo "$pool-$i"; done)"
  have="$(kc get nodes -l ray-llm-disagg.io/pool -o name | sed 's#^node/##')"
  for n in $have; do
    grep -qx "$n" <<<"$want" || kc delete node "$n" --wait=false >/dev/null
  done
  manifests="$(desired_nodes "$spec" | while read -r pool i; do
    grep -qx "$pool-$i" <<<"$have" || { render_node "$pool" "$i"; echo "---"; }
  done)"
  if [ -n "$manifests" ]; then
    kc create -f - <<<"$manifests" >/dev/null || rld::die "creating nodes failed (kubectl output above); a manifest: hack/cluster.sh render prefill-0"
  fi
  [ -n "$want" ] || return 0   # no fake nodes (hack/e2e.sh brings a real one)
  mapfile -t refs < <(sed 's#^#node/#' <<<"$want")
  wait_ready kwok "all ${#refs[@]} nodes Ready (${refs[*]#node/})" kc wait --for condition=Ready --timeout 5s "${refs[@]}"
  kc get nodes -L ray-llm-disagg.io/pool,node.kubernetes.io/instance-type --no-headers |
    awk '{c[$6" ("$7")"]++} END {for (p in c) printf "  pool %-28s %d node(s) Ready\n", p, c[p]}' >&2
}

# --- commands ---------------------------------------------------------------------------------------

healthy() {
  local c
  [ -f "$KC" ] || return 1
  for c in "${COMPONENTS[@]}"; do pid_of "$c" >/dev/null || return 1; done
  kc get --raw /readyz >/dev/null 2>&1
}

check_binaries() {
  local c
  for c in "${COMPONENTS[@]}" kubectl; do
    [ -x "$BIN/$c" ] || rld::die "$BIN/$c is missing: build the toolchain first with hack/toolchain.sh"
  done
  { command -v openssl && command -v curl; } >/dev/null || rld::die "openssl and curl are required (apt-get install openssl curl)"
}

cmd_up() {
  local spec="${RLD_NODES:-}" t0 p
  while [ $# -gt 0 ]; do
    case "$1" in
      --nodes) spec="${2:?--nodes needs pool=count[,pool=count]}"; shift 2 ;;
      --nodes=*) spec="${1#--nodes=}"; shift ;;
      *) rld::die "unknown argument to up: '$1'" ;;
    esac
  done
  desired_nodes "$spec" >/dev/null   # validate before starting anything
  t0=$(date +%s%N)
  if healthy; then
    rld::log "cluster already running (state: $STATE); reconciling node pools"
  else
    check_binaries
    [ ! -d "$STATE" ] || { rld::log "found a stale or partial cluster in $STATE: stopping it first"; cmd_down; }
    for p in $ETCD_PORT $ETCD_PEER_PORT $API_PORT $KCM_PORT $SCHED_PORT $OPERATOR_PROBE_PORT; do
      port_free "$p" || rld::die "port 127.0.0.1:$p is in use by another process; stop it or set RLD_PORT_BASE (now $PORT_BASE)"
    done
    mkdir -p "$STATE/logs" "$STATE/pids"
    write_pki
    [ -d "$TEMPLATE/etcd" ] || rld::timed "etcd template (CRDs, once)" make_template
    cp -a "$TEMPLATE/etcd" "$STATE/etcd"
    rld::timed "etcd ready" start_etcd --force-new-cluster   # a copy: take this member as the whole cluster
    rld::timed "kube-apiserver ready" start_apiserver
    rld::timed "controller-manager ready" start_controller_manager
    rld::timed "scheduler ready" start_scheduler
    rld::timed "kwok ready" start_kwok
    rld::timed "KubeRay CRDs established" ensure_crds
    rld::timed "ray-operator ready" start_operator
  fi
  rld::timed "node pools ready" reconcile_nodes "$spec"
  rld::log "cluster up in $(rld::since "$t0"); use it with: eval \"\$(hack/cluster.sh env)\""
}

cmd_down() {
  local i
  [ -d "$STATE" ] || { rld::log "no cluster state in $STATE: nothing to stop"; return 0; }
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do stop "${COMPONENTS[$i]}"; done
  rm -rf "$STATE"
  rld::log "cluster stopped, $STATE removed"
}

cmd_status() {
  local c pid
  [ -d "$STATE" ] || { echo "no cluster (state dir $STATE missing); start one with: hack/cluster.sh up"; return 1; }
  for c in "${COMPONENTS[@]}"; do
    if pid="$(pid_of "$c")"; then printf '  %-24s running (pid %s)\n' "$c" "$pid"
    else printf '  %-24s NOT RUNNING (log: %s)\n' "$c" "$STATE/logs/$c.log"; fi
  done
  healthy || { echo "cluster unhealthy: hack/cluster.sh down && hack/cluster.sh up"; return 1; }
  kc get nodes -L ray-llm-disagg.io/pool,node.kubernetes.io/instance-type
  kc get crd -o name | grep ray.io
}

cmd_env() {
  echo "export KUBECONFIG=\"$KC\""
  echo "export PATH=\"$BIN:\$PATH\""
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  nodes) healthy || rld::die "no healthy cluster in $STATE: run hack/cluster.sh up first"; reconcile_nodes "${2:?nodes needs pool=count[,pool=count]}" ;;
  render) render_node "${2%-*}" "${2##*-}" ;;
  *) usage; [ -n "${1:-}" ] && exit 2 || exit 0 ;;
esac
