#!/usr/bin/env bash
# One-command GPU check (issue 7): record single + every distributed strategy at the largest
# NCCL world size this machine allows (one rank per GPU; 1 GPU: world size 1, which still runs
# all_gather / reduce_scatter kernels on the NCCL stream), then a bigger model (hidden 4096,
# bf16), run `analyzer report` on everything and print the report. Everything goes under OUTDIR.
#
#   scripts/device_check.sh OUTDIR
#
# Needs python3 with torch (CUDA build), pandas, pyarrow, typer, rich, safetensors; no internet.
# msgspec (the analyzer's trace decoder) may be missing on a GPU image: put its wheel (and any
# other missing wheel) in <repo>/.whl/ and this script installs them offline into
# OUTDIR/.site first (see README "GPU"). The project itself is used from the checkout via
# PYTHONPATH, never installed.
#
# Environment (defaults are the GPU check; CI uses DEVICE=cpu with tiny shapes):
#   DEVICE=cuda|cpu   NPROC (default: visible GPUs; cpu: 2)   HIDDEN=256 LAYERS=2 SEQ=128 BATCH
#   BIG_HIDDEN=4096 BIG_LAYERS=2 BIG_SEQ=512 BIG_BATCH (0 = skip the big model)  STEPS_ACTIVE=3
#   TIMEOUT=120 (collective timeout, s)
# GPU-only step (issue 45; cuda only, GPU_ONLY=0 skips it): fsdp2 --float8 (torchao: carry its
# wheel in .whl/ where the image lacks it; it pulls in nothing else) and fsdp2_tp --async-tp,
# each at the small shapes, reported apart into OUTDIR/gpu-only-report; their parity verdicts and
# tolerances (for bench/RESULTS.md) in OUTDIR/gpu-only.md. fsdp2_tp needs >= 2 ranks (a tp
# degree of 2): on one GPU the step says so instead of recording it.
# Projection step (issue 44): `tracer project` of world PROJ_NPROC=8 fsdp2 and hsdp 2x4 of the
# reference model in bf16 (AdamW), real tensors where they fit this device, else fake ones (the
# tool decides), and fsdp2 again on fake tensors (its live-bytes peak beside the real allocator
# peak); per-rank allocator peak beside the sharding arithmetic in
# OUTDIR/projection-memory.{json,md} (bench/project_memory.py). cuda: PROJ_HIDDEN=4096
# PROJ_SEQ=512 PROJ_BATCH=16; cpu: 64, 16, 8. PROJ_LAYERS=2. PROJECT=0 skips it; PROJ_ONLY=1
# runs only it (no records, no report).
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
REPO="$(cd "$(dirname "$0")/.." && pwd)"
OUTDIR="$(mkdir -p "$1" && cd "$1" && pwd)"
DEVICE="${DEVICE:-cuda}"
PY="${PYTHON:-python3}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

if compgen -G "$REPO/.whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$OUTDIR/.site" "$REPO"/.whl/*.whl
  export PYTHONPATH="$PYTHONPATH:$OUTDIR/.site"
fi
"$PY" - <<'PY' || { echo "device_check: a required package is missing (see README GPU: carry wheels in .whl/)" >&2; exit 2; }
import importlib, sys
missing = [m for m in ("torch", "pandas", "pyarrow", "typer", "rich", "msgspec", "safetensors")
           if importlib.util.find_spec(m) is None]
if missing:
    print("device_check: missing python packages:", ", ".join(missing), file=sys.stderr)
    sys.exit(1)
PY

if [ "$DEVICE" = cuda ]; then
  GPUS="$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')"
  [ "$GPUS" -ge 1 ] || { echo "device_check: DEVICE=cuda but torch sees no GPU" >&2; exit 2; }
  NPROC="${NPROC:-$GPUS}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
    > "$OUTDIR/nvidia-smi.txt" 2>&1 || true
else
  NPROC="${NPROC:-2}"
fi
HIDDEN="${HIDDEN:-256}"; LAYERS="${LAYERS:-2}"; SEQ="${SEQ:-128}"; BATCH="${BATCH:-$((4 * NPROC))}"
BIG_HIDDEN="${BIG_HIDDEN:-4096}"; BIG_LAYERS="${BIG_LAYERS:-2}"; BIG_SEQ="${BIG_SEQ:-512}"
BIG_BATCH="${BIG_BATCH:-$((2 * NPROC))}"; ACTIVE="${STEPS_ACTIVE:-3}"; TIMEOUT="${TIMEOUT:-120}"
TRACES="$OUTDIR/traces"
mkdir -p "$TRACES"

"$PY" - "$OUTDIR/versions.json" <<'PY'
import json, platform, sys, torch
v = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
     "cuda_available": torch.cuda.is_available()}
if torch.cuda.is_available():
    v["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    v["cudnn"] = torch.backends.cudnn.version()
    try:
        n = torch.cuda.nccl.version()
        v["nccl"] = ".".join(map(str, n)) if isinstance(n, tuple) else str(n)
    except Exception as exc:  # report, do not stop the check
        v["nccl"] = f"unavailable: {exc}"
json.dump(v, open(sys.argv[1], "w"), indent=1)
print("device_check:", json.dumps(v))
PY

record() {  # record NAME ARGS...: one `tracer record --strategy all`, log kept under OUTDIR
  local name="$1"; shift
  local t0=$SECONDS
  echo "device_check: recording $name (nproc $NPROC, device $DEVICE) ..."
  if ! "$PY" -m tracer record --strategy all --nproc "$NPROC" --device "$DEVICE" \
      --active "$ACTIVE" --timeout "$TIMEOUT" --out "$TRACES" --name "$name" "$@" \
      > "$OUTDIR/record-$name.log" 2>&1; then
    cat "$OUTDIR/record-$name.log" >&2
    echo "device_check: record $name FAILED" >&2
    return 1
  fi
  echo "device_check: $name recorded in $((SECONDS - t0)) s"
}

project() {  # project NAME ARGS...: one `tracer project` into OUTDIR/projections
  local name="$1"; shift
  local t0=$SECONDS
  echo "device_check: projecting $name (world $PROJ_NPROC, hidden $PROJ_HIDDEN, device $DEVICE) ..."
  if ! "$PY" -m tracer project --nproc "$PROJ_NPROC" --device "$DEVICE" --precision bf16 \
      --optimizer adamw --hidden "$PROJ_HIDDEN" --layers "$PROJ_LAYERS" --seq "$PROJ_SEQ" \
      --batch "$PROJ_BATCH" --out "$OUTDIR/projections" --name "$name" "$@" \
      > "$OUTDIR/project-$name.log" 2>&1; then
    cat "$OUTDIR/project-$name.log" >&2
    echo "device_check: project $name FAILED" >&2
    return 1
  fi
  cat "$OUTDIR/project-$name.log"  # the fake-tensor decision, when made
  echo "device_check: $name projected in $((SECONDS - t0)) s"
}

status=0
if [ "${PROJECT:-1}" = 1 ]; then
  PROJ_NPROC="${PROJ_NPROC:-8}"; PROJ_LAYERS="${PROJ_LAYERS:-2}"
  if [ "$DEVICE" = cuda ]; then
    PROJ_HIDDEN="${PROJ_HIDDEN:-4096}"; PROJ_SEQ="${PROJ_SEQ:-512}"; PROJ_BATCH="${PROJ_BATCH:-16}"
  else
    PROJ_HIDDEN="${PROJ_HIDDEN:-64}"; PROJ_SEQ="${PROJ_SEQ:-16}"; PROJ_BATCH="${PROJ_BATCH:-8}"
  fi
  pstatus=0
  project "fsdp2-w$PROJ_NPROC-h$PROJ_HIDDEN" --strategy fsdp2 || pstatus=1
  project "hsdp-2x$((PROJ_NPROC / 2))-h$PROJ_HIDDEN" --strategy hsdp --mesh "2,$((PROJ_NPROC / 2))" || pstatus=1
  # the same fsdp2 on fake tensors: its live-bytes peak beside the real run's allocator peak
  project "fsdp2-w$PROJ_NPROC-h$PROJ_HIDDEN-fake" --strategy fsdp2 --fake-tensors || pstatus=1
  if [ "$pstatus" -eq 0 ]; then
    "$PY" "$REPO/bench/project_memory.py" collect "$OUTDIR"/projections/*/ \
      --out "$OUTDIR/projection-memory.json" > /dev/null || pstatus=1
    "$PY" "$REPO/bench/project_memory.py" markdown "$OUTDIR/projection-memory.json" \
      --title "Projected per-rank memory, world $PROJ_NPROC, hidden $PROJ_HIDDEN, bf16, on $DEVICE (issue 44)" \
      --command "DEVICE=$DEVICE scripts/device_check.sh OUTDIR (projection step)" \
      > "$OUTDIR/projection-memory.md" && cat "$OUTDIR/projection-memory.md" || pstatus=1
  fi
  [ "$pstatus" -eq 0 ] || status=1
fi
if [ "${PROJ_ONLY:-0}" = 1 ]; then
  exit "$status"
fi
record small --hidden "$HIDDEN" --layers "$LAYERS" --seq "$SEQ" --batch "$BATCH" || status=1
if [ "$BIG_BATCH" -gt 0 ]; then
  # the kept baseline of the big model is GBs (batch, weights, gradients, updated weights): keep
  # only its per-tensor summaries and sha256 (kept.parquet) unless KEEP_BASELINE=1
  keep=summaries
  [ "${KEEP_BASELINE:-0}" = 1 ] && keep=full
  record big --hidden "$BIG_HIDDEN" --layers "$BIG_LAYERS" --seq "$BIG_SEQ" --batch "$BIG_BATCH" \
    --precision bf16 --keep-tensors "$keep" || status=1
fi

gpu_only() {  # the --float8 / --async-tp records (issue 45), their report and verdicts
  local gtraces="$OUTDIR/gpu-only-traces" gstatus=0 notes=()
  mkdir -p "$gtraces"
  one() {  # one NAME ARGS...: one strategy recorded into gpu-only-traces
    local name="$1"; shift
    echo "device_check: recording $name (nproc $NPROC) ..."
    if ! "$PY" -m tracer record --nproc "$NPROC" --device cuda --active "$ACTIVE" \
        --timeout "$TIMEOUT" --out "$gtraces" --name "$name" --hidden "$HIDDEN" \
        --layers "$LAYERS" --seq "$SEQ" --batch "$BATCH" "$@" > "$OUTDIR/record-$name.log" 2>&1; then
      cat "$OUTDIR/record-$name.log" >&2
      echo "device_check: record $name FAILED" >&2
      return 1
    fi
  }
  if "$PY" -c 'import torchao' 2>/dev/null; then
    one fsdp2-float8 --strategy fsdp2 --float8 || gstatus=1
  else
    notes+=("fsdp2 --float8: not recorded, torchao is not importable here (put its wheel in .whl/)")
  fi
  if [ "$NPROC" -ge 2 ] && [ $((NPROC % 2)) -eq 0 ]; then
    one fsdp2_tp-async --strategy fsdp2_tp --async-tp || gstatus=1
  else
    notes+=("fsdp2_tp --async-tp: not recorded, world $NPROC has no tensor-parallel degree >= 2 (one GPU)")
  fi
  if compgen -G "$gtraces/*/manifest.json" >/dev/null; then
    "$PY" -m analyzer report "$gtraces" --out "$OUTDIR/gpu-only-report" \
      > "$OUTDIR/gpu-only-report.stdout" 2>&1 || [ $? -le 3 ] || gstatus=1
  fi
  "$PY" - "$OUTDIR/gpu-only-report/report.json" "$OUTDIR/gpu-only.md" ${notes[@]+"${notes[@]}"} <<'PY' || gstatus=1
import json, pathlib, sys
src, dst, notes = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3:]
lines = ["| run | strategy and settings | parity | tolerance | median step (ms) |", "|---|---|---|---|---|"]
if src.exists():
    for r in json.loads(src.read_text())["runs"]:
        p, tol = r.get("parity") or {}, (r.get("parity") or {}).get("tolerance") or {}
        opts = ", ".join(f"{k}={v}" for k, v in (r.get("options") or {}).items() if k in ("float8", "async_tp"))
        step = (r.get("step_time_ns") or {}).get("median")
        lines.append(f"| {r['name']} | {r['strategy']} {opts} | {p.get('status', '-')} | rtol {tol.get('rtol')}, "
                     f"atol {tol.get('atol')} ({tol.get('precision', '')}) | "
                     f"{'-' if step is None else f'{step / 1e6:.2f}'} |")
lines += [f"- {n}" for n in notes]
dst.write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
  return "$gstatus"
}
if [ "$DEVICE" = cuda ] && [ "${GPU_ONLY:-1}" = 1 ]; then
  gpu_only || status=1
fi

echo "device_check: analyzer report $TRACES"
rc=0
"$PY" -m analyzer report "$TRACES" --out "$OUTDIR/report" > "$OUTDIR/report.stdout" 2>&1 || rc=$?
cat "$OUTDIR/report.stdout"  # the report prints report.md
echo "device_check: report exit code $rc (0 ranked, 3 parity gate withheld a run; see README)"
[ "$status" -eq 0 ] || exit 1
[ "$rc" -le 3 ] || exit "$rc"
exit 0
