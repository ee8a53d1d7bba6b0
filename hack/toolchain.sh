#!/usr/bin/env bash
# Build the local Kubernetes test toolchain from the Go module proxy and PyPI into a cache
# outside the work tree: ${RLD_CACHE:-~/.cache/ray-llm-disagg}/<tool>-<version>/, plus
# ${RLD_CACHE}/bin (one symlink per tool) and ${RLD_CACHE}/schemas (kubeconform JSON schemas).
#
#   hack/toolchain.sh                      build everything missing (idempotent; warm run takes seconds)
#   hack/toolchain.sh --only helm,ct       build only these tools (names below)
#   hack/toolchain.sh env                  print `export ...` lines (PATH, CT_CONFIG_DIR, schema locations)
#   hack/toolchain.sh list                 print the tool names in build order
#
# Versions come from versions.env. Go caches stay at their defaults (~/go, ~/.cache/go-build).
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Build order matters: helm is needed first by the chart work; the k8s binaries take longest.
TOOLS=(helm kubeconform ct pytools schemas promop-schemas promtool promql ray-operator kwok etcd k8s coredns kube-router)
BIN="$RLD_CACHE/bin"
export GOFLAGS="-p=${RLD_GO_JOBS:-2} -buildvcs=false"
K8S_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
STAGING_VERSION="v0.${K8S_VERSION#v1.}"   # k8s.io/<staging> v0.Y.Z  <->  Kubernetes v1.Y.Z
WRAPPERS="$RLD_ROOT/hack/k8s"

dir_of() { printf '%s/%s-%s' "$RLD_CACHE" "$1" "$2"; }

# go_install DEST LDFLAGS PKG@VERSION: `go install` one main package into DEST.
go_install() {
  mkdir -p "$1"
  (cd "${TMPDIR:-/tmp}" && GOBIN="$1" go install -trimpath -ldflags "-s -w $2" "$3") ||
    rld::die "go install $3 failed (see the go output above). Check the proxy serves it: go list -m -versions ${3%@*}"
}

# go_build_module MODULE@VERSION DEST LDFLAGS PKG...: build packages with the downloaded module itself as the
# main module (its own go.mod/go.sum). Needed where the proxy serves the version but refuses its version
# list, which `go install pkg@version` asks for (chart-testing).
go_build_module() {
  local src tmp rc=0; src="$(rld::moddir "$1")"; shift
  local dest="$1" ldflags="$2"; shift 2
  tmp="$(mktemp -d)"; cp -r "$src/." "$tmp/"; chmod -R u+w "$tmp"; mkdir -p "$dest"
  (cd "$tmp" && go build -trimpath -ldflags "-s -w $ldflags" -o "$dest/" "$@") || rc=$?
  rm -rf "$tmp"
  [ "$rc" -eq 0 ] || rld::die "go build of $* in module $src failed (see the go output above)"
}

# go_build_in_wrapper WRAPPER_DIR DEST LDFLAGS PKG...: build main packages of a dependency through a wrapper module.
go_build_in_wrapper() {
  local wrapper="$1" dest="$2" ldflags="$3"; shift 3
  mkdir -p "$dest"
  (cd "$wrapper" && go build -trimpath -ldflags "-s -w $ldflags" -o "$dest/" "$@") ||
    rld::die "go build in $wrapper failed for: $*. If go.sum is stale, delete $wrapper/go.mod and rerun to regenerate it."
}

# ---------------------------------------------------------------------------------------------
# Each tool has <tool>_current (prints the version the cached artifact reports, or nothing),
# <tool>_want (the version it should report) and <tool>_build.

helm_dir()     { dir_of helm "$HELM_VERSION"; }
helm_want()    { echo "$HELM_VERSION kube=v1.34"; }
helm_current() {
  local h c; h="$(helm_dir)/helm"; [ -x "$h" ] || return 0
  # .Capabilities.KubeVersion is compiled in (helm v3 defaults to 1.20 without the ldflags below).
  c="$(mktemp -d)"; mkdir -p "$c/templates"
  printf 'apiVersion: v2\nname: probe\nversion: 0.0.0\n' > "$c/Chart.yaml"
  printf 'kind: ConfigMap\napiVersion: v1\nmetadata: {name: probe}\ndata: {kube: "{{ .Capabilities.KubeVersion.Version }}"}\n' > "$c/templates/cm.yaml"
  echo "$("$h" version --template '{{.Version}}') kube=$("$h" template x "$c" | grep -oE 'v1\.[0-9]+' || true)"
  rm -rf "$c"
}
helm_build() {
  local p=helm.sh/helm/v3 kmin="${K8S_VERSION#v1.}"; kmin="${kmin%%.*}"
  go_install "$(helm_dir)" "-X $p/internal/version.version=$HELM_VERSION \
    -X $p/pkg/chartutil.k8sVersionMajor=1 -X $p/pkg/chartutil.k8sVersionMinor=$kmin \
    -X $p/pkg/lint/rules.k8sVersionMajor=1 -X $p/pkg/lint/rules.k8sVersionMinor=$kmin" "$p/cmd/helm@$HELM_VERSION"
}

kubeconform_dir()     { dir_of kubeconform "$KUBECONFORM_VERSION"; }
kubeconform_want()    { echo "$KUBECONFORM_VERSION"; }
kubeconform_current() { local b; b="$(kubeconform_dir)/kubeconform"; [ ! -x "$b" ] || "$b" -v; }
kubeconform_build() {
  go_install "$(kubeconform_dir)" "-X main.version=$KUBECONFORM_VERSION" \
    "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
}

ct_dir()     { dir_of ct "$CT_VERSION"; }
ct_want()    { echo "$CT_VERSION"; }
ct_current() {
  local d; d="$(ct_dir)"
  [ -x "$d/ct" ] && [ -f "$d/etc/chart_schema.yaml" ] && [ -f "$d/etc/lintconf.yaml" ] || return 0
  "$d/ct" version | awk '/^Version:/ {print $2}'
}
ct_build() {
  local m=github.com/helm/chart-testing/v3 d; d="$(ct_dir)"
  go_build_module "$m@$CT_VERSION" "$d" "-X $m/ct/cmd.Version=$CT_VERSION" ./ct
  mkdir -p "$d/etc"
  cp "$(rld::moddir "$m@$CT_VERSION")/etc/"{chart_schema.yaml,lintconf.yaml} "$d/etc/"
  chmod u+w "$d/etc/"*
}

# yamllint + yamale (called by ct lint) in a small venv; also provides pyyaml for the schema scripts.
pytools_dir()     { dir_of pytools "yamllint$YAMLLINT_VERSION-yamale$YAMALE_VERSION"; }
pytools_want()    { echo "yamllint=$YAMLLINT_VERSION yamale=$YAMALE_VERSION"; }
pytools_current() {
  local py; py="$(pytools_dir)/bin/python"; [ -x "$py" ] || return 0
  "$py" -c 'import importlib.metadata as m; print("yamllint=%s yamale=%s" % (m.version("yamllint"), m.version("yamale")))' 2>/dev/null || true
}
pytools_build() {
  local d; d="$(pytools_dir)"
  rm -rf "$d"
  python3 -m venv "$d" || rld::die "python3 -m venv failed: install python3-venv (Debian) or use a full CPython"
  "$d/bin/pip" install --quiet --disable-pip-version-check "yamllint==$YAMLLINT_VERSION" "yamale==$YAMALE_VERSION" pyyaml ||
    rld::die "pip install yamllint==$YAMLLINT_VERSION yamale==$YAMALE_VERSION failed: is PyPI reachable? (pip index versions yamllint)"
}

# kubeconform schemas: KubeRay CRDs via kubeconform's openapi2jsonschema.py, core kinds via hack/k8s/k8s_openapi_to_jsonschema.py.
schemas_kuberay() { echo "$RLD_CACHE/schemas/kuberay-$KUBERAY_VERSION"; }
schemas_k8s()     { echo "$RLD_CACHE/schemas/k8s-$K8S_VERSION"; }
schemas_want()    { echo "kuberay=$KUBERAY_VERSION k8s=$K8S_VERSION"; }
schemas_current() {
  [ -f "$(schemas_kuberay)/.complete" ] && [ -f "$(schemas_k8s)/.complete" ] || return 0
  echo "kuberay=$KUBERAY_VERSION k8s=$K8S_VERSION"
}
schemas_build() {
  local py kc ro kube out
  py="$(pytools_dir)/bin/python"
  [ -x "$py" ] || rld::die "schemas need the pytools venv (pyyaml): run hack/toolchain.sh --only pytools,schemas"
  kc="$(rld::moddir "github.com/yannh/kubeconform@$KUBECONFORM_VERSION")"
  ro="$(rld::moddir "github.com/ray-project/kuberay/ray-operator@$KUBERAY_VERSION")"
  kube="$(rld::moddir "k8s.io/kubernetes@$K8S_VERSION")"
  out="$(schemas_kuberay)"; rm -rf "$out"; mkdir -p "$out"
  (cd "$out" && "$py" "$kc/scripts/openapi2jsonschema.py" "$ro"/config/crd/bases/ray.io_*.yaml >/dev/null) ||
    rld::die "openapi2jsonschema.py failed on $ro/config/crd/bases"
  [ -f "$out/rayservice_v1.json" ] || rld::die "no rayservice_v1.json produced in $out"
  touch "$out/.complete"
  out="$(schemas_k8s)"; rm -rf "$out"
  "$py" "$WRAPPERS/k8s_openapi_to_jsonschema.py" "$kube/api/openapi-spec/swagger.json" "$out" ||
    rld::die "converting $kube/api/openapi-spec/swagger.json to JSON schemas failed"
  touch "$out/.complete"
}

# Prometheus Operator CRD schemas (PodMonitor, ServiceMonitor, PrometheusRule, ...) for kubeconform, from the
# operator's Go module (example/prometheus-operator-crd), converted like KubeRay's.
schemas_promop() { echo "$RLD_CACHE/schemas/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION"; }
promop-schemas_want()    { echo "$PROMETHEUS_OPERATOR_VERSION"; }
promop-schemas_current() { [ ! -f "$(schemas_promop)/.complete" ] || echo "$PROMETHEUS_OPERATOR_VERSION"; }
promop-schemas_build() {
  local py kc po out
  py="$(pytools_dir)/bin/python"
  [ -x "$py" ] || rld::die "schemas need the pytools venv (pyyaml): run hack/toolchain.sh --only pytools,promop-schemas"
  kc="$(rld::moddir "github.com/yannh/kubeconform@$KUBECONFORM_VERSION")"
  po="$(rld::moddir "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION")"
  out="$(schemas_promop)"; rm -rf "$out"; mkdir -p "$out"
  (cd "$out" && "$py" "$kc/scripts/openapi2jsonschema.py" "$po"/example/prometheus-operator-crd/monitoring.coreos.com_*.yaml >/dev/null) ||
    rld::die "openapi2jsonschema.py failed on $po/example/prometheus-operator-crd"
  for k in podmonitor servicemonitor prometheusrule; do
    [ -f "$out/${k}_v1.json" ] || rld::die "no ${k}_v1.json produced in $out"
  done
  touch "$out/.complete"
}

# promtool (rule checks and rule unit tests) from github.com/prometheus/prometheus. Its Go module versions
# map to releases as v0.3MM.P = Prometheus 3.MM.P.
prom_release() { local v="${PROMETHEUS_VERSION#v0.}"; printf '%d.%d.%s' $(( ${v%%.*} / 100 )) $(( ${v%%.*} % 100 )) "${v#*.}"; }
promtool_dir()     { dir_of promtool "$PROMETHEUS_VERSION"; }
promtool_want()    { prom_release; }
promtool_current() { local b; b="$(promtool_dir)/promtool"; [ ! -x "$b" ] || "$b" --version | awk 'NR == 1 {print $3}'; }
promtool_build() {
  go_install "$(promtool_dir)" "-X github.com/prometheus/common/version.Version=$(prom_release)" \
    "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION"
}

# promql-selectors (hack/promql): Prometheus' PromQL parser as a command; lists the series each query selects.
promql_dir()     { dir_of promql "$PROMETHEUS_VERSION"; }
promql_want()    { echo "$PROMETHEUS_VERSION"; }
promql_current() { go_mod_version "$(promql_dir)/promql-selectors" github.com/prometheus/prometheus; }
promql_build() {
  local w="$RLD_ROOT/hack/promql"
  ensure_wrapper "$w" "github.com/prometheus/prometheus $PROMETHEUS_VERSION" gen_promql_wrapper
  (cd "$w" && go build -trimpath -ldflags "-s -w" -o "$(promql_dir)/promql-selectors" .) ||
    rld::die "go build in $w failed (see the go output above)"
}
gen_promql_wrapper() {
  printf 'module ray-llm-disagg.local/promql\n\ngo 1.24.0\n\nrequire github.com/prometheus/prometheus %s\n' "$PROMETHEUS_VERSION" > go.mod
}

ray-operator_dir()     { dir_of ray-operator "$KUBERAY_VERSION"; }
ray-operator_want()    { echo "$KUBERAY_VERSION"; }
ray-operator_current() { go_mod_version "$(ray-operator_dir)/ray-operator" github.com/ray-project/kuberay/ray-operator; }
ray-operator_build()   { go_install "$(ray-operator_dir)" "" "github.com/ray-project/kuberay/ray-operator@$KUBERAY_VERSION"; }

# go_mod_version BINARY MODULE: the version of MODULE (main module or dependency) a Go binary was built from.
go_mod_version() {
  [ -x "$1" ] || return 0
  go version -m "$1" | awk -v m="$2" '($1=="mod" || $1=="dep") && $2==m {print $3; exit}'
}

kwok_dir()     { dir_of kwok "$KWOK_VERSION"; }
kwok_want()    { echo "$KWOK_VERSION"; }
kwok_current() { go_mod_version "$(kwok_dir)/kwok" sigs.k8s.io/kwok; }
kwok_build()   { go_install "$(kwok_dir)" "" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"; }

# etcd's server module carries replace directives, so `go install @version` refuses it: build through hack/k8s/etcd.
etcd_dir()     { dir_of etcd "$ETCD_VERSION"; }
etcd_want()    { echo "${ETCD_VERSION#v}"; }
etcd_current() { local b; b="$(etcd_dir)/etcd"; [ ! -x "$b" ] || "$b" --version | awk '/^etcd Version:/ {print $3}'; }
etcd_build() {
  local w="$WRAPPERS/etcd"
  ensure_wrapper "$w" "go.etcd.io/etcd/server/v3 $ETCD_VERSION" gen_etcd_wrapper
  go_build_in_wrapper "$w" "$(etcd_dir)" "" go.etcd.io/etcd/server/v3
  mv "$(etcd_dir)/server" "$(etcd_dir)/etcd"   # go names the binary after the package dir, server/
}
gen_etcd_wrapper() {
  printf 'module ray-llm-disagg.local/etcd-wrapper\n\ngo 1.24.0\n' > go.mod
  go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
}

# kube-apiserver & co. from k8s.io/kubernetes through hack/k8s/wrapper: its go.mod pins every staging
# module (required at v0.0.0 upstream) to the published v0.Y.Z.
k8s_dir()     { dir_of k8s "$K8S_VERSION"; }
k8s_want()    { echo "$K8S_VERSION"; }
k8s_current() {
  local d b v; d="$(k8s_dir)"
  for b in "${K8S_BINARIES[@]}"; do [ -x "$d/$b" ] || return 0; done
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
    v="$("$d/$b" --version | awk '{print $2}')"; [ "$v" = "$K8S_VERSION" ] || { echo "$b=$v"; return 0; }
  done
  "$d/kubectl" version --client -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])'
}
k8s_build() {
  local w="$WRAPPERS/wrapper" v=k8s.io/component-base/version cv=k8s.io/client-go/pkg/version ld="" kmin
  kmin="${K8S_VERSION#v1.}"; kmin="${kmin%%.*}"
  ensure_wrapper "$w" "k8s.io/kubernetes $K8S_VERSION" gen_k8s_wrapper
  for p in $v $cv; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$kmin -X $p.gitTreeState=clean"
    ld+=" -X $p.gitCommit=0000000000000000000000000000000000000000 -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  go_build_in_wrapper "$w" "$(k8s_dir)" "$ld" "${K8S_BINARIES[@]/#/k8s.io/kubernetes/cmd/}"
}
gen_k8s_wrapper() {
  local gomod m
  gomod="$(cd "${TMPDIR:-/tmp}" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
           python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  {
    printf 'module ray-llm-disagg.local/k8s-wrapper\n\ngo 1.24.0\n\n'
    grep '^godebug' "$gomod"; echo
    echo "require k8s.io/kubernetes $K8S_VERSION"; echo
    echo "// k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with ./staging/...,"
    echo "// which only works inside its own repo. Pin each to the published $STAGING_VERSION instead."
    echo "replace ("
    for m in $(grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" | awk '{print $1}' | sort -u); do
      printf '\t%s => %s %s\n' "$m" "$m" "$STAGING_VERSION"
    done
    echo ")"
  } > go.mod
  local pkgs=("${K8S_BINARIES[@]/#/k8s.io/kubernetes/cmd/}")
  go get -tool "${pkgs[@]/%/@$K8S_VERSION}"   # an explicit version: without it go get takes the newest
}

# The real one-node cluster's DNS and NetworkPolicy enforcer (hack/e2e.sh); plain `go install`, no replaces.
coredns_dir()     { dir_of coredns "$COREDNS_VERSION"; }
coredns_want()    { echo "$COREDNS_VERSION"; }
coredns_current() { go_mod_version "$(coredns_dir)/coredns" github.com/coredns/coredns; }
coredns_build()   { go_install "$(coredns_dir)" "" "github.com/coredns/coredns@$COREDNS_VERSION"; }

kube-router_dir()     { dir_of kube-router "$KUBE_ROUTER_VERSION"; }
kube-router_want()    { echo "$KUBE_ROUTER_VERSION"; }
kube-router_current() { go_mod_version "$(kube-router_dir)/kube-router" github.com/cloudnativelabs/kube-router/v2; }
kube-router_build() {
  go_install "$(kube-router_dir)" "-X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$KUBE_ROUTER_VERSION" \
    "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION"
}

# ensure_wrapper DIR "MODULE VERSION" GENERATOR: (re)generate DIR/go.mod with GENERATOR unless it already requires that version.
ensure_wrapper() {
  local dir="$1" req="$2" gen="$3"
  mkdir -p "$dir"
  if grep -qE "^\s*(require )?${req% *} ${req#* }( // indirect)?\$" "$dir/go.mod" 2>/dev/null && [ -f "$dir/go.sum" ]; then
    return 0
  fi
  rld::log "generating $dir/go.mod for $req (commit it afterwards)"
  (cd "$dir" && rm -f go.mod go.sum && "$gen" && go mod tidy) ||
    rld::die "generating the wrapper module in $dir failed: a module may not be served by the proxy (see above)"
}

# ---------------------------------------------------------------------------------------------

# link_bin: ${RLD_CACHE}/bin/<tool> -> the cached binary of the pinned version (only for tools that are built).
link_bin() {
  local name target t
  mkdir -p "$BIN"
  while read -r name target; do
    if [ -x "$target" ]; then ln -sfn "$target" "$BIN/$name"; else rm -f "$BIN/$name"; fi
  done <<EOF
helm $(helm_dir)/helm
kubeconform $(kubeconform_dir)/kubeconform
promtool $(promtool_dir)/promtool
promql-selectors $(promql_dir)/promql-selectors
ct $(ct_dir)/ct
yamllint $(pytools_dir)/bin/yamllint
yamale $(pytools_dir)/bin/yamale
ray-operator $(ray-operator_dir)/ray-operator
kwok $(kwok_dir)/kwok
etcd $(etcd_dir)/etcd
coredns $(coredns_dir)/coredns
kube-router $(kube-router_dir)/kube-router
$(for t in "${K8S_BINARIES[@]}"; do echo "$t $(k8s_dir)/$t"; done)
EOF
}

print_env() {
  cat <<EOF
export PATH="$BIN:\$PATH"
export CT_CONFIG_DIR="$(ct_dir)/etc"
export RLD_KUBECONFORM_SCHEMAS="-schema-location $(schemas_k8s)/{{.ResourceKind}}{{.KindSuffix}}.json -schema-location $(schemas_kuberay)/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json -schema-location $(schemas_promop)/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json"
EOF
}

ensure_tool() {
  local t="$1" want have start
  want="$("${t}_want")"; have="$("${t}_current" 2>/dev/null || true)"
  if [ "$have" = "$want" ]; then
    rld::log "$(printf '%-28s cached (%s)' "$t" "$want")"
    return 0
  fi
  rld::log "building $t ($want)${have:+, cached one reports '$have'}"
  start=$(date +%s%N)
  rld::timed "built $t" "${t}_build"
  # cold build times, for the record (tests/cluster prints them)
  printf '%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$t" "$want" "$(rld::since "$start")" >> "$RLD_CACHE/build-times.tsv"
  have="$("${t}_current" 2>/dev/null || true)"
  [ "$have" = "$want" ] ||
    rld::die "$t was built but reports '$have', expected '$want'. Remove $(dir_of "$t" '*') and rerun; check the ldflags in hack/toolchain.sh"
}

main() {
  local only="" t start
  case "${1:-}" in
    env)  print_env; return ;;
    list) printf '%s\n' "${TOOLS[@]}"; return ;;
    --only) only="${2:?--only needs a comma-separated list: $(IFS=,; echo "${TOOLS[*]}")}" ;;
    --only=*) only="${1#--only=}" ;;
    "") ;;
    -h|--help) usage; return ;;
    *) rld::die "unknown argument '$1'. Usage: hack/toolchain.sh [--only a,b] | env | list" ;;
  esac
  command -v go >/dev/null || rld::die "go not found on PATH: install Go >= 1.24 first"
  for t in ${only//,/ }; do
    [[ " ${TOOLS[*]} " == *" $t "* ]] || rld::die "unknown tool '$t'; known: ${TOOLS[*]}"
  done
  start=$(date +%s%N)
  for t in "${TOOLS[@]}"; do
    [ -z "$only" ] || [[ ",$only," == *",$t,"* ]] || continue
    ensure_tool "$t"
  done
  link_bin
  rld::log "toolchain ready in $(rld::since "$start"); put it on PATH with: eval \"\$(hack/toolchain.sh env)\""
}

main "$@"
