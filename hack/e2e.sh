#!/usr/bin/env bash
# A REAL one-node Kubernetes for tests/e2e: real kubelet, containerd + runc, bridge CNI, CoreDNS, kube-proxy,
# NetworkPolicy enforcement (kube-router's firewall), on the control plane of hack/cluster.sh (etcd,
# kube-apiserver, controller-manager, scheduler, KubeRay operator; no fake nodes). Pods run the image built
# from images/ (cpu variant). Then the chart is installed from examples/cpu-tiny.yaml with an API-key Secret
# and its NetworkPolicy, and the serve Service is forwarded to a loopback address.
#
#   hack/e2e.sh up        build/reuse everything, start it, install the chart, wait for the RayService;
#                         last stdout line: READY <base_url> <api_key>
#   hack/e2e.sh down      uninstall, stop everything, remove mounts, netns, bridge, iptables rules, state
#   hack/e2e.sh env       print `export` lines: KUBECONFIG, PATH (kubectl, helm), RLD_E2E_* facts for tests
#   hack/e2e.sh install RELEASE NAMESPACE [helm args...]   another release of the chart on the node (cpu-tiny +
#                         the node's values + the args), waits for its RayService (tests/e2e's secure values)
#   hack/e2e.sh image     build (or reuse) the cpu image tarball only; prints its path
#   hack/e2e.sh status    what runs
#
# Needs root (containerd, kubelet, CNI) and, once, apt packages (installed on first `up`). Docs: docs/real-node.md.
# State: ${RLD_E2E_STATE:-/tmp/ray-llm-disagg-e2e}. Cache: ${RLD_CACHE}/e2e (image tarballs, containerd's
# image store, docker's build cache). Ports: ${RLD_E2E_PORT_BASE:-26500} + 1..20 (control plane: +1..+6).
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

STATE="${RLD_E2E_STATE:-/tmp/ray-llm-disagg-e2e}"
E2E_CACHE="$RLD_CACHE/e2e"
BIN="$RLD_CACHE/bin"
PORT_BASE="${RLD_E2E_PORT_BASE:-26500}"
KUBELET_PORT=$((PORT_BASE + 10)) KUBELET_HEALTHZ_PORT=$((PORT_BASE + 11))
PROXY_HEALTHZ_PORT=$((PORT_BASE + 12)) PROXY_METRICS_PORT=$((PORT_BASE + 13))
SERVE_PORT=$((PORT_BASE + 15))
# hack/cluster.sh runs the control plane: its own state dir and ports, a Service CIDR pods can route to
# (kube-proxy DNATs it), no fake node pools.
export RLD_STATE="$STATE/cluster" RLD_PORT_BASE="$PORT_BASE" RLD_SERVICE_CIDR="${RLD_E2E_SERVICE_CIDR:-10.96.0.0/16}"
export RLD_NODES="cpu=0,prefill=0,decode=0,prefill-p5en=0,decode-p5en=0"
KC="$RLD_STATE/kubeconfig"
NODE=rld-e2e-node
BRIDGE=rld-cni0
POD_CIDR="${RLD_E2E_POD_CIDR:-10.244.0.0/24}"
GW="${POD_CIDR%.*}.1"           # the bridge's address: node IP, CoreDNS, kubelet server
NS=rld-e2e
RELEASE=tiny
IMAGE_REPO=ray-llm-disagg.local/ray-llm-disagg
PAUSE_IMAGE=ray-llm-disagg.local/pause:1
BASE_REF="ray-llm-disagg.local/debian:${DEBIAN_SUITE:-bookworm}"
CHART="$RLD_ROOT/charts/ray-llm-disagg"
CTR_SOCK="$STATE/containerd.sock"
DAEMONS=(socat-serve kube-router kube-proxy kubelet coredns containerd)   # stop order
APT_PACKAGES=(containerd runc containernetworking-plugins iptables ipset conntrack socat mmdebstrap docker.io nftables)
WAIT_S="${RLD_E2E_WAIT_S:-120}"
READY_TIMEOUT_S="${RLD_E2E_READY_TIMEOUT_S:-1200}"

export PATH="$BIN:$PATH"
kc() { kubectl --kubeconfig "$KC" "$@"; }
ctrk() { ctr --address "$CTR_SOCK" -n k8s.io "$@"; }

# --- processes (same pattern as hack/cluster.sh: setsid, pidfile, log) ------------------------------------

start() {   # start NAME EXE ARGS...
  local name="$1" exe="$2"; shift 2
  setsid "$exe" "$@" > "$STATE/logs/$name.log" 2>&1 < /dev/null &
  echo "$!" > "$STATE/pids/$name"
  echo "$(readlink -f "$exe")" > "$STATE/pids/$name.exe"
}
pid_of() {
  local pid exe
  pid="$(cat "$STATE/pids/$1" 2>/dev/null)" || return 1
  exe="$(readlink "/proc/$pid/exe" 2>/dev/null)" || return 1
  [ "$exe" = "$(cat "$STATE/pids/$1.exe")" ] && echo "$pid"
}
stop() {
  local name="$1" pid i
  pid="$(pid_of "$name")" || { rm -f "$STATE/pids/$name" "$STATE/pids/$name.exe"; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$pid" 2>/dev/null && { rld::log "$name (pid $pid) ignored SIGTERM for 10s, sending SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; }
  rm -f "$STATE/pids/$name" "$STATE/pids/$name.exe"
}
wait_ready() {   # wait_ready NAME WHAT CMD...
  local name="$1" what="$2"; shift 2
  if ! rld::wait_for "$WAIT_S" "$what" "$@"; then
    pid_of "$name" >/dev/null || rld::log "$name is not running (exited early)"
    rld::log "last lines of $STATE/logs/$name.log:"; tail -n 25 "$STATE/logs/$name.log" >&2 || true
    rld::die "$name did not become ready ($what). Full log: $STATE/logs/$name.log. Then: hack/e2e.sh down && hack/e2e.sh up"
  fi
}

# --- prerequisites ---------------------------------------------------------------------------------------

ensure_packages() {
  local missing=() p
  for p in "${APT_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ "${#missing[@]}" -eq 0 ] && return 0
  command -v apt-get >/dev/null || rld::die "missing packages ${missing[*]} and no apt-get: install them (Debian names)"
  rld::log "installing ${missing[*]} (apt)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2 ||
    { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2; } ||
    rld::die "apt-get install ${missing[*]} failed"
}

check_prereqs() {
  local b
  [ "$(id -u)" = 0 ] || rld::die "hack/e2e.sh needs root (containerd, kubelet and CNI change the host's network and mounts)"
  ensure_packages
  for b in kubelet kube-proxy kubectl helm coredns kube-router etcd kube-apiserver ray-operator; do
    [ -x "$BIN/$b" ] || rld::die "$BIN/$b is missing: run hack/toolchain.sh (it builds the node's binaries too)"
  done
}

# --- images: a local Debian base (mmdebstrap), the pause image, the runtime image (images/build.sh) --------

# image_inputs_hash: everything the cpu image is built from (what .dockerignore lets into the context, the
# recipe, the Python pins). Its tarball is cached under this key.
image_inputs_hash() {
  (cd "$RLD_ROOT" && {
    cat images/Dockerfile images/build.sh images/requirements.py .dockerignore pyproject.toml
    grep -E '^(PYTHON|RAY|VLLM|TORCH|NIXL|EFA_INSTALLER)_VERSION=|^DEBIAN_SUITE=' versions.env
    find serve_app -type f -not -path '*/__pycache__/*' -not -name '*.pyc' | LC_ALL=C sort | xargs sha256sum
  } | sha256sum | cut -c1-12)
}
image_ref() { echo "$IMAGE_REPO:cpu-$(image_inputs_hash)"; }
image_tar() { echo "$E2E_CACHE/images/ray-llm-disagg-cpu-$(image_inputs_hash).tar"; }
base_tar() { echo "$E2E_CACHE/images/debian-${DEBIAN_SUITE:-bookworm}-minbase.tar"; }
pause_tar() { echo "$E2E_CACHE/images/pause-1.tar"; }

DOCKER_STARTED=0
docker_cli() { /usr/bin/docker -H "unix://$STATE/docker.sock" "$@"; }
start_docker() {
  [ "$DOCKER_STARTED" = 1 ] && return 0
  mkdir -p "$STATE/logs" "$STATE/pids" "$E2E_CACHE/docker"
  # Only to build images: no iptables rules, no bridge (builds use the host network), its own containerd.
  start dockerd /usr/sbin/dockerd --data-root "$E2E_CACHE/docker" --exec-root "$STATE/docker-exec" \
    -H "unix://$STATE/docker.sock" --pidfile "$STATE/docker.pid" --iptables=false --ip-forward=false \
    --ip-masq=false --bridge=none --storage-driver overlay2
  wait_ready dockerd "dockerd answers on $STATE/docker.sock" docker_cli version
  DOCKER_STARTED=1
}
stop_docker() {
  [ "$DOCKER_STARTED" = 1 ] || return 0
  stop dockerd
  DOCKER_STARTED=0
}

build_base() {
  local tar; tar="$(base_tar)"
  [ -s "$tar" ] && return 0
  mkdir -p "$(dirname "$tar")"
  rld::log "building the Debian ${DEBIAN_SUITE:-bookworm} base rootfs with mmdebstrap"
  nice mmdebstrap --variant=minbase --format=tar --include=ca-certificates "${DEBIAN_SUITE:-bookworm}" "$tar.tmp" >&2 ||
    rld::die "mmdebstrap failed (is deb.debian.org reachable?)"
  mv "$tar.tmp" "$tar"
}

build_pause() {
  local tar d; tar="$(pause_tar)"
  [ -s "$tar" ] && return 0
  d="$(mktemp -d)"
  (cd "$RLD_ROOT/hack/k8s/pause" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$d/rootfs/pause" .) ||
    rld::die "building hack/k8s/pause failed"
  tar -C "$d/rootfs" -cf "$d/pause-rootfs.tar" pause
  docker_cli import -c 'ENTRYPOINT ["/pause"]' "$d/pause-rootfs.tar" "$PAUSE_IMAGE" >/dev/null
  docker_cli save -o "$tar.tmp" "$PAUSE_IMAGE" && mv "$tar.tmp" "$tar"
  rm -rf "$d"
}

# ensure_image_tars: the three image tarballs, built with a temporary dockerd if any is missing.
ensure_image_tars() {
  local tar ref ca=""
  tar="$(image_tar)" ref="$(image_ref)"
  [ -s "$tar" ] && [ -s "$(pause_tar)" ] && return 0
  mkdir -p "$STATE/logs" "$STATE/pids" "$(dirname "$tar")"
  build_base
  start_docker
  trap stop_docker EXIT   # also when a build step dies
  build_pause
  if [ ! -s "$tar" ]; then
    if ! docker_cli image inspect "$BASE_REF" >/dev/null 2>&1; then
      docker_cli import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'CMD ["/bin/bash"]' "$(base_tar)" "$BASE_REF" >/dev/null || rld::die "docker import of $(base_tar) failed"
    fi
    # The host's CA bundle (a TLS-intercepting proxy's CA included) for pip/apt in the build: a build
    # secret, never a layer and never a file in the repo.
    [ -s /etc/ssl/certs/ca-certificates.crt ] && ca=/etc/ssl/certs/ca-certificates.crt
    rld::log "building $ref from images/Dockerfile (cpu variant; docker build log: $STATE/logs/image-build.log)"
    if ! RLD_BUILD_CA_BUNDLE="$ca" DOCKER=/usr/bin/docker DOCKER_HOST="unix://$STATE/docker.sock" \
         nice "$RLD_ROOT/images/build.sh" "$ref" --variant cpu --base "$BASE_REF" --network host --progress plain \
         > "$STATE/logs/image-build.log" 2>&1; then
      tail -n 30 "$STATE/logs/image-build.log" >&2
      rld::die "images/build.sh failed (full log: $STATE/logs/image-build.log)"
    fi
    rld::log "saving $ref to $tar"
    docker_cli save -o "$tar.tmp" "$ref" && mv "$tar.tmp" "$tar" || rld::die "docker save $ref failed"
    # older tarballs of the recipe are superseded
    find "$(dirname "$tar")" -name 'ray-llm-disagg-cpu-*.tar' ! -path "$tar" -delete
  fi
  stop_docker
  trap - EXIT
}

# import_images: into containerd's k8s.io namespace (kept across down/up: containerd's root is in the cache).
import_images() {
  local ref tar
  for pair in "$PAUSE_IMAGE $(pause_tar)" "$(image_ref) $(image_tar)"; do
    ref="${pair% *}" tar="${pair#* }"
    if ! ctrk images ls -q | grep -qx "docker.io/$ref\|$ref"; then
      rld::log "importing $ref into containerd (k8s.io)"
      ctrk images import --no-unpack=false "$tar" >&2 || rld::die "ctr images import $tar failed"
    fi
  done
  # older builds of the recipe: drop them (containerd then collects their layers and snapshots)
  for ref in $(ctrk images ls -q | grep -F "$IMAGE_REPO:" | grep -vx "\(docker.io/\)\?$(image_ref)" || true); do
    ctrk images rm "$ref" >/dev/null 2>&1 || true
  done
}

# --- node --------------------------------------------------------------------------------------------------

snapshot_host() {   # what `down` compares against and restores: iptables rules and tables, sysctls
  iptables_rules > "$STATE/host/iptables.before"
  { nft list tables 2>/dev/null || true; } > "$STATE/host/nft-tables.before"
  cat /proc/sys/net/ipv4/ip_forward > "$STATE/host/ip_forward.before"
  [ ! -r /proc/sys/net/bridge/bridge-nf-call-iptables ] || cat /proc/sys/net/bridge/bridge-nf-call-iptables > "$STATE/host/bridge-nf-call-iptables.before"
  touch "$STATE/host/started"
}

setup_network() {
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  ip addr show dev "$BRIDGE" | grep -q "inet $GW/" || ip addr add "$GW/${POD_CIDR#*/}" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  echo 1 > /proc/sys/net/ipv4/ip_forward
  # NetworkPolicy and Service rules must see traffic between pods on the one bridge
  [ ! -w /proc/sys/net/bridge/bridge-nf-call-iptables ] || echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables
  mkdir -p "$STATE/cni/net.d" "$STATE/cni/ipam"
  cat > "$STATE/cni/net.d/10-rld-e2e.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "rld-e2e",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$STATE/cni/ipam",
              "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$GW"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "firewall"},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

start_containerd() {
  mkdir -p "$E2E_CACHE/containerd" "$STATE/containerd-state"
  cat > "$STATE/containerd.toml" <<EOF
version = 2
root = "$E2E_CACHE/containerd"
state = "$STATE/containerd-state"
[grpc]
  address = "$CTR_SOCK"
[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE/containerd-opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # root in this kind of VM lacks CAP_SYS_RESOURCE: without this, runc cannot lower a sandbox's
  # oom_score_adj and every pod fails with "can't get final child's PID from pipe: EOF"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
EOF
  start containerd /usr/bin/containerd --config "$STATE/containerd.toml"
  wait_ready containerd "containerd answers on $CTR_SOCK" ctr --address "$CTR_SOCK" version
}

write_node_kubeconfig() {   # the admin token of hack/cluster.sh's kubeconfig (a one-node test cluster)
  cp "$KC" "$STATE/node.kubeconfig"
}

start_coredns() {
  cat > "$STATE/Corefile" <<EOF
.:53 {
    bind $GW
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $STATE/node.kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    forward . /etc/resolv.conf
    cache 30
}
EOF
  start coredns "$BIN/coredns" -conf "$STATE/Corefile"
  wait_ready coredns "CoreDNS resolves kubernetes.default on $GW" \
    bash -c "getent hosts kubernetes.default.svc.cluster.local >/dev/null 2>&1 || python3 - <<'PY'
import socket,struct,sys
q=struct.pack('>HHHHHH',1,0x100,1,0,0,0)+b''.join(bytes([len(p)])+p.encode() for p in 'kubernetes.default.svc.cluster.local'.split('.'))+b'\0'+struct.pack('>HH',1,1)
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(1); s.sendto(q,('$GW',53)); r=s.recv(512)
sys.exit(0 if (r[3]&15)==0 and struct.unpack('>H',r[6:8])[0]>0 else 1)
PY"
}

start_kubelet() {
  mkdir -p "$STATE/kubelet" "$STATE/pod-logs" "$STATE/kubelet-plugins"
  cat > "$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $GW
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
# Served on the bridge address only; the API server reaches it for logs/exec/port-forward.
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$CTR_SOCK
clusterDNS: [$GW]
clusterDomain: cluster.local
podLogsDir: $STATE/pod-logs
volumePluginDir: $STATE/kubelet-plugins
serializeImagePulls: false
maxPods: 30
evictionHard: {memory.available: 200Mi, nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
EOF
  start kubelet "$BIN/kubelet" --config "$STATE/kubelet.yaml" --kubeconfig "$STATE/node.kubeconfig" \
    --root-dir "$STATE/kubelet" --cert-dir "$STATE/kubelet/pki" --hostname-override "$NODE" --node-ip "$GW" \
    --node-labels "ray-llm-disagg.io/e2e=true" -v=1
  wait_ready kubelet "node $NODE Ready" kc wait --for condition=Ready --timeout 5s "node/$NODE"
  # kube-proxy and kube-router read the node's pod CIDR (no CIDR allocator runs here)
  [ -n "$(kc get node "$NODE" -o jsonpath='{.spec.podCIDR}')" ] ||
    kc patch node "$NODE" --type merge -p "{\"spec\":{\"podCIDR\":\"$POD_CIDR\",\"podCIDRs\":[\"$POD_CIDR\"]}}" >/dev/null
}

start_kube_proxy() {
  cat > "$STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $STATE/node.kubeconfig}
hostnameOverride: $NODE
mode: iptables
clusterCIDR: $POD_CIDR
healthzBindAddress: 127.0.0.1:$PROXY_HEALTHZ_PORT
metricsBindAddress: 127.0.0.1:$PROXY_METRICS_PORT
nodePortAddresses: ["$GW/32"]
# keep the host's conntrack sysctls as they are
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  start kube-proxy "$BIN/kube-proxy" --config "$STATE/kube-proxy.yaml"
  wait_ready kube-proxy "kube-proxy /healthz on 127.0.0.1:$PROXY_HEALTHZ_PORT" curl -sf "http://127.0.0.1:$PROXY_HEALTHZ_PORT/healthz"
}

start_kube_router() {
  # NetworkPolicy enforcement only (iptables + ipset); routing and Service proxying stay off.
  start kube-router "$BIN/kube-router" --kubeconfig "$STATE/node.kubeconfig" --hostname-override "$NODE" \
    --run-firewall=true --run-router=false --run-service-proxy=false --run-loadbalancer=false \
    --service-cluster-ip-range "$RLD_SERVICE_CIDR" --health-port 0 --metrics-port 0 --enable-ipv6=false
  # (its health server would listen on every address: off; it is ready once its chains hook into FORWARD)
  wait_ready kube-router "kube-router's firewall chains in FORWARD" bash -c "iptables -S FORWARD | grep -q KUBE-ROUTER-FORWARD"
}

# --- the release ---------------------------------------------------------------------------------------------

model_dir() {
  local py; py="$("$RLD_ROOT/hack/pyenv.sh" python)"
  local dir
  dir="$(cd "$RLD_ROOT" && "$py" -c 'from devstack.tiny_model import ensure_tiny_model; print(ensure_tiny_model())' | tail -n 1)"
  # mounted by hostPath into pods that may run as any uid (ci/secure-values.yaml: 1000): world-readable
  chmod -R a+rX "$dir"
  echo "$dir"
}

# helm_install RELEASE NAMESPACE [helm args...]: the chart from examples/cpu-tiny.yaml + hack/k8s/e2e-values.yaml
# on the image built from images/ and devstack's tiny model (hostPath), then later -f/--set args.
helm_install() {
  local release="$1" ns="$2" model ref g sets=(); shift 2
  model="$(model_dir | tail -n 1)"; [ -d "$model" ] || rld::die "tiny model not found at '$model'"
  ref="$(image_ref)"
  for g in head prefill decode; do
    sets+=(--set "$g.extraVolumes[0].name=model" --set "$g.extraVolumes[0].hostPath.path=$model")
  done
  kc create namespace "$ns" --dry-run=client -o yaml | kc apply -f - >/dev/null
  helm --kubeconfig "$KC" upgrade --install "$release" "$CHART" -n "$ns" \
    -f "$CHART/examples/cpu-tiny.yaml" -f "$RLD_ROOT/hack/k8s/e2e-values.yaml" \
    --set "image.repository=${ref%:*}" --set "image.tag=${ref##*:}" \
    --set "tests.image.repository=${ref%:*}" --set "tests.image.tag=${ref##*:}" "${sets[@]}" \
    "$@" >&2 || rld::die "helm upgrade --install $release failed"
}

install_release() {
  local key
  key="$(cat "$STATE/api-key" 2>/dev/null || true)"
  [ -n "$key" ] || { key="rld-e2e-$(openssl rand -hex 12)"; echo "$key" > "$STATE/api-key"; }
  kc create namespace "$NS" --dry-run=client -o yaml | kc apply -f - >/dev/null
  kc -n "$NS" create secret generic rld-e2e-api-keys --from-literal "keys=$key" --dry-run=client -o yaml | kc apply -f - >/dev/null
  helm_install "$RELEASE" "$NS" --set "auth.apiKeySecret.name=rld-e2e-api-keys" --set "auth.apiKeySecret.key=keys"
}

# wait_rayservice RELEASE NAMESPACE: until the RayService is Ready (pods' progress logged as it changes).
wait_rayservice() {
  local release="$1" ns="$2" deadline last="" now
  deadline=$(( $(date +%s) + READY_TIMEOUT_S ))
  while :; do
    # Ready, and (after an upgrade that rolls a new RayCluster: e.g. a new image on a running node) serving from
    # the new cluster with the old one gone: only then do the release's pods run what was just installed
    if kc -n "$ns" get rayservice "$release-ray-llm-disagg" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True &&
       [ -z "$(kc -n "$ns" get rayservice "$release-ray-llm-disagg" -o jsonpath='{.status.pendingServiceStatus.rayClusterName}' 2>/dev/null)" ] &&
       [ "$(kc -n "$ns" get raycluster -o name 2>/dev/null | grep -c "/$release-ray-llm-disagg-")" -le 1 ]; then
      return 0
    fi
    now="$(kc -n "$ns" get pods -o custom-columns=NAME:.metadata.name,PHASE:.status.phase,READY:.status.containerStatuses[*].ready --no-headers 2>/dev/null | tr -s ' ' | tr '\n' ';')"
    [ "$now" = "$last" ] || { rld::log "pods: ${now:-none yet}"; last="$now"; }
    [ "$(date +%s)" -lt "$deadline" ] || {
      kc -n "$ns" get rayservice,raycluster,pods -o wide >&2 || true
      rld::die "RayService $release not Ready after ${READY_TIMEOUT_S}s (kubectl -n $ns describe rayservice; logs: kubectl -n $ns logs <pod>)"
    }
    sleep 5
  done
}

serve_svc() { kc -n "$NS" get svc -l "ray.io/serve=true" -o name 2>/dev/null | head -n 1; }

start_forwarder() {
  local svc ip
  wait_ready kubelet "the serve Service exists" bash -c "[ -n \"\$(kubectl --kubeconfig '$KC' -n $NS get svc $RELEASE-ray-llm-disagg-serve-svc -o name)\" ]"
  ip="$(kc -n "$NS" get svc "$RELEASE-ray-llm-disagg-serve-svc" -o jsonpath='{.spec.clusterIP}')"
  # the host reaches the ClusterIP through kube-proxy's rules (OUTPUT chain), like a pod would
  start socat-serve /usr/bin/socat "TCP-LISTEN:$SERVE_PORT,bind=127.0.0.1,fork,reuseaddr" "TCP:$ip:8000"
  wait_ready socat-serve "http://127.0.0.1:$SERVE_PORT/v1/models answers" \
    curl -sf -H "Authorization: Bearer $(cat "$STATE/api-key")" "http://127.0.0.1:$SERVE_PORT/v1/models"
}

# --- commands ------------------------------------------------------------------------------------------------

healthy() {
  local d
  for d in containerd coredns kubelet kube-proxy kube-router; do pid_of "$d" >/dev/null || return 1; done
  "$RLD_ROOT/hack/cluster.sh" status >/dev/null 2>&1
}

cmd_up() {
  local t0; t0=$(date +%s%N)
  check_prereqs
  if ! healthy; then
    [ ! -d "$STATE" ] || { rld::log "found a stale or partial e2e node in $STATE: stopping it first"; cmd_down; }
    mkdir -p "$STATE/logs" "$STATE/pids" "$STATE/host"
    snapshot_host
    rld::timed "images built/cached" ensure_image_tars
    rld::timed "control plane (hack/cluster.sh)" "$RLD_ROOT/hack/cluster.sh" up >&2
    write_node_kubeconfig
    rld::timed "network ($BRIDGE $GW)" setup_network
    rld::timed "containerd ready" start_containerd
    rld::timed "images in containerd" import_images
    rld::timed "CoreDNS ready" start_coredns
    rld::timed "kubelet: node Ready" start_kubelet
    rld::timed "kube-proxy ready" start_kube_proxy
    rld::timed "kube-router ready" start_kube_router
  else
    rld::log "e2e node already running (state: $STATE)"
    rld::timed "images built/cached" ensure_image_tars
    rld::timed "images in containerd" import_images
  fi
  rld::timed "helm install" install_release
  rld::timed "RayService Ready" wait_rayservice "$RELEASE" "$NS"
  pid_of socat-serve >/dev/null || rld::timed "serve Service on 127.0.0.1:$SERVE_PORT" start_forwarder
  rld::log "e2e up in $(rld::since "$t0"); use it with: eval \"\$(hack/e2e.sh env)\""
  echo "READY http://127.0.0.1:$SERVE_PORT/v1 $(cat "$STATE/api-key")"
}

# our_mounts: mount points under our state/cache dirs (deepest first)
our_mounts() { awk -v s="$STATE" -v c="$E2E_CACHE" '$2 ~ "^"s"/" || $2 ~ "^"c"/" {print $2}' /proc/mounts | sort -r; }

cmd_down() {
  local pid d t
  [ -d "$STATE" ] || { rld::log "no e2e state in $STATE: nothing to stop"; return 0; }
  stop socat-serve
  if pid_of kubelet >/dev/null && [ -f "$KC" ] && kc get --raw /readyz >/dev/null 2>&1; then
    helm --kubeconfig "$KC" uninstall "$RELEASE" -n "$NS" --wait --timeout 60s >/dev/null 2>&1 || true
    kc delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
    kc delete pods --all --all-namespaces --grace-period 5 --timeout 60s >/dev/null 2>&1 || true
    rld::wait_for 60 "pods gone" bash -c "[ -z \"\$(kubectl --kubeconfig '$KC' get pods -A -o name 2>/dev/null)\" ]" || true
  fi
  stop kube-router
  [ -x "$BIN/kube-router" ] && "$BIN/kube-router" --cleanup-config >/dev/null 2>&1 || true
  stop kube-proxy
  [ -x "$BIN/kube-proxy" ] && "$BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
  stop kubelet
  stop coredns
  # what the kubelet left: containers and sandboxes (their shims outlive containerd)
  if pid_of containerd >/dev/null; then
    for t in $(ctrk tasks ls -q 2>/dev/null); do ctrk tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
    sleep 1
    for t in $(ctrk tasks ls -q 2>/dev/null); do ctrk tasks delete -f "$t" >/dev/null 2>&1 || true; done
    for t in $(ctrk containers ls -q 2>/dev/null); do ctrk containers delete "$t" >/dev/null 2>&1 || true; done
  fi
  stop containerd
  for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $CTR_SOCK" || true); do kill -KILL "$pid" 2>/dev/null || true; done
  stop dockerd
  "$RLD_ROOT/hack/cluster.sh" down >&2 || true
  for d in $(our_mounts); do umount "$d" 2>/dev/null || umount -l "$d" 2>/dev/null || true; done
  # network namespaces of our pods (containerd names them cni-<uuid>; only those still mounted from our sandboxes)
  for d in /var/run/netns/cni-*; do
    [ -e "$d" ] || continue
    if [ -f "$STATE/host/started" ] && [ "$d" -nt "$STATE/host/started" ]; then umount "$d" 2>/dev/null || true; rm -f "$d"; fi
  done
  ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE" || true
  cleanup_iptables
  [ -f "$STATE/host/ip_forward.before" ] && cat "$STATE/host/ip_forward.before" > /proc/sys/net/ipv4/ip_forward || true
  [ -f "$STATE/host/bridge-nf-call-iptables.before" ] &&
    cat "$STATE/host/bridge-nf-call-iptables.before" > /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || true
  # cgroups the kubelet created (cgroup v1: one hierarchy per controller)
  find /sys/fs/cgroup/*/kubepods* -depth -type d -exec rmdir {} + 2>/dev/null || true
  if [ -n "$(our_mounts)" ]; then rld::log "WARNING: mounts left under $STATE or $E2E_CACHE: $(our_mounts | tr '\n' ' ')"; fi
  rm -rf "$STATE"
  rld::log "e2e node stopped, $STATE removed (images stay cached in $E2E_CACHE)"
}

# iptables_rules: the host's rules, without counters, chain declarations or empty tables' headers
iptables_rules() {
  { iptables-save 2>/dev/null || true; ip6tables-save 2>/dev/null | sed 's/^-/ip6 -/' || true; } |
    grep -v '^[#:*]' | grep -vx COMMIT | sed 's/\[[0-9]*:[0-9]*\]//' || true
}

# cleanup_iptables: chains the kubelet, kube-proxy, kube-router and the CNI plugins add; then whatever still
# differs from the snapshot taken at `up` is reported.
cleanup_iptables() {
  local table chain rule ipt
  # IPv6 too: the kubelet adds its KUBE-FIREWALL/KUBE-KUBELET-CANARY chains with ip6tables as well
  for ipt in iptables ip6tables; do
    for table in filter nat mangle raw; do
      { "$ipt-save" -t "$table" 2>/dev/null || true; } | { grep -E '^-A .*(KUBE-|CNI-|'"$BRIDGE"')' || true; } |
        sed 's/^-A /-D /' | while read -r rule; do eval "$ipt -t $table $rule" 2>/dev/null || true; done
      for chain in $({ "$ipt-save" -t "$table" 2>/dev/null || true; } | awk -F'[: ]' '/^:(KUBE-|CNI-)/ {print $2}'); do
        "$ipt" -t "$table" -F "$chain" 2>/dev/null || true
      done
      for chain in $({ "$ipt-save" -t "$table" 2>/dev/null || true; } | awk -F'[: ]' '/^:(KUBE-|CNI-)/ {print $2}'); do
        "$ipt" -t "$table" -X "$chain" 2>/dev/null || true
      done
    done
  done
  for chain in $({ ipset list -n 2>/dev/null || true; } | grep -E '^(KUBE-|kube-router)' || true); do
    ipset destroy "$chain" 2>/dev/null || true
  done
  # nf_tables tables (iptables' nft backend) that appeared with the node and hold no rule now: gone, as before `up`
  if [ -f "$STATE/host/nft-tables.before" ] && command -v nft >/dev/null; then
    { nft list tables 2>/dev/null || true; } | while read -r _ family name; do
      grep -qx "table $family $name" "$STATE/host/nft-tables.before" && continue
      if [ -z "$(nft list table "$family" "$name" 2>/dev/null | grep -vE '^\s*(table |chain |type |\}|$)')" ]; then
        nft delete table "$family" "$name" 2>/dev/null || true
      fi
    done
  fi
  if [ -f "$STATE/host/iptables.before" ]; then
    iptables_rules > "$STATE/host/iptables.after"
    diff -q "$STATE/host/iptables.before" "$STATE/host/iptables.after" >/dev/null ||
      rld::log "WARNING: iptables differ from before up: $(diff "$STATE/host/iptables.before" "$STATE/host/iptables.after" | head -n 5 | tr '\n' ' ')"
  fi
}

cmd_env() {
  echo "export KUBECONFIG=\"$KC\""
  echo "export PATH=\"$BIN:\$PATH\""
  echo "export RLD_E2E_STATE=\"$STATE\" RLD_E2E_NAMESPACE=$NS RLD_E2E_RELEASE=$RELEASE RLD_E2E_NODE=$NODE"
  echo "export RLD_E2E_IMAGE=\"$(image_ref)\" RLD_E2E_CONTAINERD_SOCK=\"$CTR_SOCK\""
  echo "export RLD_E2E_BASE_URL=\"http://127.0.0.1:$SERVE_PORT/v1\""
}

cmd_status() {
  local d pid
  [ -d "$STATE" ] || { echo "no e2e node (state dir $STATE missing); start one with: hack/e2e.sh up"; return 1; }
  for d in "${DAEMONS[@]}"; do
    if pid="$(pid_of "$d")"; then printf '  %-14s running (pid %s)\n' "$d" "$pid"
    else printf '  %-14s NOT RUNNING (log: %s)\n' "$d" "$STATE/logs/$d.log"; fi
  done
  "$RLD_ROOT/hack/cluster.sh" status || true
  [ ! -f "$KC" ] || kc get nodes,pods -A -o wide || true
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  env) cmd_env ;;
  status) cmd_status ;;
  install) shift; [ $# -ge 2 ] || rld::die "usage: hack/e2e.sh install RELEASE NAMESPACE [helm args...]"
           healthy || rld::die "no e2e node running: hack/e2e.sh up first"
           helm_install "$@"; wait_rayservice "$1" "$2" ;;
  image) ensure_packages; mkdir -p "$STATE/logs" "$STATE/pids"; ensure_image_tars; image_tar ;;
  *) usage; [ -n "${1:-}" ] && exit 2 || exit 0 ;;
esac
