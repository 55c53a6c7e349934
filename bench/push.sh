#!/usr/bin/env bash
# Push benchmark: infer-build push vs skopeo copy, same OCI layout (one image, one 1 GiB
# gzip layer + a small one), fresh Debian docker-registry on 127.0.0.1 per run.
#   1. push to a fresh registry     2. re-push unchanged     3. push to a second repository
# Prints one table with medians of $RUNS runs (default 3) and the infer-build/skopeo ratio.
# Usage: bench/push.sh [LAYER_MIB]   (needs a release build: cargo build --release)
set -euo pipefail
cd "$(dirname "$0")/.."
LAYER_MIB=${1:-1024}
RUNS=${RUNS:-3}
BIN=${INFER_BUILD:-target/release/infer-build}
PY=${INFER_BUILD_PYTHON:-python3}
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 1; }
command -v docker-registry >/dev/null && command -v skopeo >/dev/null || { echo "needs docker-registry and skopeo" >&2; exit 1; }

WORK=$(mktemp -d /tmp/bench-push.XXXXXX)
REG_PID=
cleanup() { [ -n "$REG_PID" ] && kill "$REG_PID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

# The layout: a 1 GiB incompressible file in a tar, gzip-wrapped with stored blocks (level 0:
# valid gzip, and nobody's time goes into deflate), plus a small config-like layer.
"$PY" - "$WORK/layout" "$LAYER_MIB" <<'PY'
import gzip, hashlib, io, json, os, sys, tarfile
root, mib = sys.argv[1], int(sys.argv[2])
os.makedirs(f"{root}/blobs/sha256")
def put(data):
    d = hashlib.sha256(data).hexdigest()
    open(f"{root}/blobs/sha256/{d}", "wb").write(data)
    return {"digest": "sha256:" + d, "size": len(data)}
class Noise(io.RawIOBase):
    def __init__(self, n): self.left = n
    def readable(self): return True
    def readinto(self, b):
        n = min(len(b), self.left)
        b[:n] = os.urandom(n); self.left -= n
        return n
tmp = f"{root}/big.tmp"
with open(tmp, "wb") as raw:
    with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=0, mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w") as t:
            info = tarfile.TarInfo("models/engine.bin"); info.size = mib << 20
            t.addfile(info, io.BufferedReader(Noise(info.size), 1 << 20))
h = hashlib.sha256()
with open(tmp, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 24), b""): h.update(chunk)
big = {"digest": "sha256:" + h.hexdigest(), "size": os.path.getsize(tmp)}
os.rename(tmp, f"{root}/blobs/sha256/{h.hexdigest()}")
small = io.BytesIO()
with gzip.GzipFile(fileobj=small, mode="wb", mtime=0) as gz:
    with tarfile.open(fileobj=gz, mode="w") as t:
        data = b"[model]\nname = \"bench\"\n"
        info = tarfile.TarInfo("etc/infer/runtime.toml"); info.size = len(data)
        t.addfile(info, io.BytesIO(data))
small = put(small.getvalue())
L = "application/vnd.oci.image.layer.v1.tar+gzip"
cfg = put(json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}, separators=(",", ":"), sort_keys=True).encode())
man = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
       "config": dict(cfg, mediaType="application/vnd.oci.image.config.v1+json"),
       "layers": [dict(big, mediaType=L), dict(small, mediaType=L)]}
md = put(json.dumps(man, separators=(",", ":"), sort_keys=True).encode())
idx = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
       "manifests": [dict(md, mediaType=man["mediaType"], annotations={"org.opencontainers.image.ref.name": "v1"})]}
open(f"{root}/index.json", "w").write(json.dumps(idx, separators=(",", ":"), sort_keys=True))
open(f"{root}/oci-layout", "w").write('{"imageLayoutVersion":"1.0.0"}')
PY

PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
start_registry() {
  [ -n "$REG_PID" ] && { kill "$REG_PID"; wait "$REG_PID" 2>/dev/null || true; }
  rm -rf "$WORK/reg"; mkdir -p "$WORK/reg"
  cat > "$WORK/reg/config.yml" <<YML
version: 0.1
log: {level: warn}
storage:
  filesystem: {rootdirectory: $WORK/reg/data}
  delete: {enabled: true}
  cache: {blobdescriptor: inmemory}
http: {addr: 127.0.0.1:$PORT, secret: bench}
YML
  docker-registry serve "$WORK/reg/config.yml" > "$WORK/reg/log" 2>&1 & REG_PID=$!
  until curl -fs "http://127.0.0.1:$PORT/v2/" >/dev/null; do sleep 0.05; done
}
now() { date +%s.%N; }
timed() { local t0; t0=$(now); "$@" >/dev/null 2>"$WORK/last.err" || { cat "$WORK/last.err" >&2; exit 1; }; echo "$(now) - $t0" | bc; }

declare -A T
for run in $(seq 1 "$RUNS"); do
  for tool in infer-build skopeo; do
    start_registry
    export INFER_BUILD_CACHE_DIR="$WORK/cache-$run"
    if [ "$tool" = infer-build ]; then
      p() { timed "$BIN" push "$WORK/layout" --to "127.0.0.1:$PORT/$1" --insecure; }
    else
      p() { timed skopeo copy --dest-tls-verify=false "oci:$WORK/layout:v1" "docker://127.0.0.1:$PORT/$1:v1"; }
    fi
    T[$tool,fresh]+="$(p bench/a) "
    T[$tool,repush]+="$(p bench/a) "
    T[$tool,mount]+="$(p bench/b) "
  done
done
median() { printf '%s\n' $1 | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem/{print $2}') GiB, $(uname -sr)"
echo "layout: one image, ${LAYER_MIB} MiB layer ($(du -sm "$WORK/layout" | cut -f1) MiB on disk); medians of $RUNS runs"
printf '| %-36s | %12s | %12s | %8s |\n' "case" "infer-build" "skopeo" "ratio"
printf '|%s|%s|%s|%s|\n' "--------------------------------------" "--------------" "--------------" "----------"
for c in fresh repush mount; do
  a=$(median "${T[infer-build,$c]}"); b=$(median "${T[skopeo,$c]}")
  case $c in fresh) name="push to a fresh registry";; repush) name="re-push, unchanged";; mount) name="push to a 2nd repository (mount)";; esac
  printf '| %-36s | %10.3f s | %10.3f s | %8.2f |\n' "$name" "$a" "$b" "$(echo "$a / $b" | bc -l)"
done
echo "raw: $(for k in "${!T[@]}"; do echo "$k=[${T[$k]% }]"; done | sort | tr '\n' ' ')"
