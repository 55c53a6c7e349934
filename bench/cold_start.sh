#!/usr/bin/env bash
# Cold start: the combined image against the split layout (runtime image + model image), pulled
# from a fresh Debian docker-registry on 127.0.0.1, timed from "not on this machine" to the first
# successful inference, plus the bytes a model update moves in each layout (version 2 built a day
# after version 1, SOURCE_DATE_EPOCH set as CI sets it).
#   combined          docker pull of the combined image, docker run, first inference
#   split (runtime    the runtime image already pulled (a pre-pull DaemonSet, or any other model of
#   present)          the same flavour on the node): pull the model image (skopeo), unpack it (umoci:
#                     what the kubelet's image volume does), docker run -v …:/mnt/models:ro, first
#                     inference
#   split (nothing    both pulled, then as above
#   present)
# The model: an MLP of fp32 2048x2048 layers with random weights, MODEL_MIB MiB of weights
# (default 256), served by tract (the static runtime, FROM scratch).
# Usage: bench/cold_start.sh [MODEL_MIB]   (RUNS=3; INFER_BUILD=…, INFER_SERVE_BIN=… pick the
# binaries; needs docker, docker-registry, skopeo, umoci, python3 with onnx and numpy)
set -euo pipefail
cd "$(dirname "$0")/.."
MIB=${1:-256}
RUNS=${RUNS:-3}
BIN=${INFER_BUILD:-target/release/infer-build}
SERVE=${INFER_SERVE_BIN:-target/runtime/x86_64-unknown-linux-gnu/release-serve/static/infer-serve}
PY=${INFER_BUILD_PYTHON:-python3}
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 1; }
[ -x "$SERVE" ] || { echo "build the runtime first: PROFILE=release-serve scripts/build-runtime.sh" >&2; exit 1; }
for t in docker docker-registry skopeo umoci curl; do
  command -v "$t" >/dev/null || { echo "needs $t" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/bench-cold.XXXXXX)
REG_PID=
CID=
cleanup() {
  [ -n "$CID" ] && docker rm -f "$CID" >/dev/null 2>&1
  [ -n "$REG_PID" ] && kill "$REG_PID" 2>/dev/null
  wait 2>/dev/null || true
  chmod -R u+w "$WORK" 2>/dev/null; rm -rf "$WORK"
}
trap cleanup EXIT

# The model and its recipe (version 1 and an update, version 2: other weights, same shapes).
"$PY" - "$WORK" "$MIB" <<'PY'
import os, sys
import numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto
work, mib = sys.argv[1], int(sys.argv[2])
D = 2048
n = max(1, (mib << 20) // (4 * D * D))
for version, seed in ((1, 1), (2, 2)):
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i in range(n):
        w = (rng.standard_normal((D, D), dtype=np.float32) / np.sqrt(D)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        y = "y" if i == n - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}" if i < n - 1 else y]))
        if i < n - 1:
            nodes.append(helper.make_node("Relu", [f"m{i}"], [y]))
        x = y
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", D])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", D])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    d = f"{work}/v{version}"
    os.makedirs(d)
    onnx.save(m, f"{d}/model.onnx")
    open(f"{d}/recipe.toml", "w").write(f"""[model]
name = "coldstart"
version = "{version}"
onnx = "model.onnx"

[model.inputs.x]
datatype = "fp32"
shape = [-1, {D}]

[model.outputs.y]
datatype = "fp32"
shape = [-1, {D}]

[targets]
cpu = true

[engine]
cpu = "tract"

[batching]
max_batch_size = 4

[image]
repository = "localhost/infer-build/coldstart"
tag = "{{version}}-{{target}}"
layout = "split"
""")
print(f"model: {n} layers of {D}x{D} fp32, {os.path.getsize(f'{work}/v1/model.onnx') >> 20} MiB", file=sys.stderr)
PY

export INFER_BUILD_CACHE_DIR="$WORK/cache"
# Each version stamped with its own build time, as CI stamps a build with its commit's.
for v in 1 2; do
  SOURCE_DATE_EPOCH=$((1700000000 + 86400 * v)) \
  "$BIN" build "$WORK/v$v/recipe.toml" --runtime "$SERVE" --out "$WORK/layout-v$v" >/dev/null 2>"$WORK/build-v$v.log" \
    || { cat "$WORK/build-v$v.log" >&2; exit 1; }
done

PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$WORK/reg"
cat >"$WORK/reg/config.yml" <<EOF
version: 0.1
storage:
  filesystem:
    rootdirectory: $WORK/reg/data
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$PORT
log:
  level: error
EOF
docker-registry serve "$WORK/reg/config.yml" >"$WORK/reg/log" 2>&1 &
REG_PID=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/v2/" >/dev/null && break; sleep 0.1; done
REPO=127.0.0.1:$PORT/bench/coldstart
for v in 1 2; do
  "$BIN" push "$WORK/layout-v$v" --to "$REPO" --insecure --json >"$WORK/push-v$v.json" 2>"$WORK/push-v$v.log" \
    || { cat "$WORK/push-v$v.log" >&2; exit 1; }
done

now() { date +%s.%N; }
body='{"inputs":[{"name":"x","shape":[1,2048],"datatype":"FP32","data":['"$("$PY" -c 'print(",".join(["0.5"]*2048))')"']}]}'
echo "$body" >"$WORK/body.json"
first_inference() {  # $1: container id; waits for a 200 from /infer
  local port; port=$(docker port "$1" 8000/tcp | head -1)
  for _ in $(seq 6000); do
    code=$(curl -s -o /dev/null -w '%{http_code}' -H 'content-type: application/json' \
      --data-binary @"$WORK/body.json" "http://$port/v2/models/coldstart/infer" || true)
    [ "$code" = 200 ] && return 0
    sleep 0.02
  done
  echo "no answer: $(docker logs "$1" 2>&1 | tail -5)" >&2; return 1
}
forget() { docker rmi -f "$REPO:1-cpu-fp32" "$REPO:1-cpu-fp32-runtime" >/dev/null 2>&1 || true; }

declare -A T
for run in $(seq "$RUNS"); do
  # combined
  forget; sync
  t0=$(now)
  docker pull -q "$REPO:1-cpu-fp32" >/dev/null
  CID=$(docker run -d -p 127.0.0.1::8000 "$REPO:1-cpu-fp32")
  first_inference "$CID"
  t1=$(now); docker rm -f "$CID" >/dev/null; CID=
  T[combined]+="$(echo "$t1 - $t0" | bc) "
  # split, nothing present, then split with the runtime present
  for case in split-cold split-runtime; do
    if [ "$case" = split-cold ]; then forget; else docker pull -q "$REPO:1-cpu-fp32-runtime" >/dev/null; fi
    rm -rf "$WORK/model-oci" "$WORK/model"; sync
    t0=$(now)
    [ "$case" = split-cold ] && docker pull -q "$REPO:1-cpu-fp32-runtime" >/dev/null
    skopeo copy -q --src-tls-verify=false "docker://$REPO:1-cpu-fp32-model" "oci:$WORK/model-oci:m" >/dev/null
    umoci raw unpack --rootless --image "$WORK/model-oci:m" "$WORK/model" 2>/dev/null
    CID=$(docker run -d -p 127.0.0.1::8000 -v "$WORK/model:/mnt/models:ro" "$REPO:1-cpu-fp32-runtime")
    first_inference "$CID"
    t1=$(now); docker rm -f "$CID" >/dev/null; CID=
    T[$case]+="$(echo "$t1 - $t0" | bc) "
  done
done
forget

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# Bytes: what each layout moves, from the pushed manifests (compressed sizes, as pulled).
"$PY" - "$WORK" "$MIB" "$RUNS" "${T[combined]}" "${T[split-runtime]}" "${T[split-cold]}" <<'PY'
import json, os, platform, sys
work, mib, runs = sys.argv[1], sys.argv[2], sys.argv[3]
def times(s): return sorted(float(x) for x in s.split())
def med(s): t = times(s); return t[len(t) // 2]
def layers(v, tag):
    idx = json.load(open(f"{work}/layout-v{v}/index.json"))
    d = next(m for m in idx["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
    m = json.load(open(f"{work}/layout-v{v}/blobs/sha256/{d['digest'][7:]}"))
    return {l["digest"]: l["size"] for l in m["layers"]} | {m["config"]["digest"]: m["config"]["size"]}
comb1, comb2 = layers(1, "1-cpu-fp32"), layers(2, "2-cpu-fp32")
rt1, rt2 = layers(1, "1-cpu-fp32-runtime"), layers(2, "2-cpu-fp32-runtime")
mod1, mod2 = layers(1, "1-cpu-fp32-model"), layers(2, "2-cpu-fp32-model")
MiB = lambda n: f"{n / 2**20:.1f} MiB"
cores = os.cpu_count()
print(f"machine: {cores} cores, {platform.machine()}, Linux {platform.release()}; model {mib} MiB of weights; medians of {runs} runs")
print("| case                                    | time to first inference | bytes pulled |")
print("|-----------------------------------------|-------------------------|--------------|")
print(f"| combined image                          | {med(sys.argv[4]):>21.2f} s | {MiB(sum(comb1.values())):>12} |")
print(f"| split, runtime image present            | {med(sys.argv[5]):>21.2f} s | {MiB(sum(mod1.values())):>12} |")
print(f"| split, nothing present                  | {med(sys.argv[6]):>21.2f} s | {MiB(sum(mod1.values()) + sum(rt1.values())):>12} |")
print(f"| ratio, split (runtime present)/combined | {med(sys.argv[5]) / med(sys.argv[4]):>23.2f} |              |")
same = rt1 == rt2
print(f"model update v1 -> v2: combined pulls {MiB(sum(s for d, s in comb2.items() if d not in comb1))} new, "
      f"split pulls {MiB(sum(s for d, s in mod2.items() if d not in mod1))} new "
      f"(runtime image {'unchanged' if same else 'CHANGED'}: {MiB(sum(rt1.values()))})")
print("raw: " + " ".join(f"{k}={times(v)}" for k, v in zip(["combined", "split-runtime", "split-cold"], sys.argv[4:7])))
PY
