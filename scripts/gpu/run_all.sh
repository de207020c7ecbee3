#!/usr/bin/env bash
# GPU acceptance runs of issue 9 on a 2-GPU machine (torch + CUDA, transformers, ray; no vLLM needed).
#
#   scripts/gpu/run_all.sh OUTDIR [tests] [arith] [perf] [sync7b]      (default: all four, ~12 min)
#   scripts/gpu/run_all.sh OUTDIR tests arith && scripts/gpu/run_all.sh OUTDIR perf sync7b   (two calls < 10 min)
#   DEVICE=cpu scripts/gpu/run_all.sh OUTDIR ...     the same at smoke size on CPU (checks the scripts)
#
# Parts (each under its own timeout; one failing never stops the others):
#   tests   pytest: GPU-marked tests (NCCL sync bit-exact, FSDP2 2 ranks, config -> engines -> fit_step -> sync
#           on 2 GPUs) + the CPU tests of the wiring that need neither vLLM nor Ray          -> tests.log
#   arith   scripts/gpu/arith_2gpu.py: arith recipe, hf rollout GPU + fsdp2 trainer GPU, NCCL sync   -> arith.{json,log}
#   perf    scripts/gpu/pipeline_perf.py: Qwen2.5-0.5B shape at 4k tokens/seq, MFU, sync, idle  -> perf.{json,log}
#   sync7b  scripts/gpu/sync7b.py: 7B-shaped sync into a generating hf replica, stall          -> sync7b.{json,log}
# At the end every part's JSON is merged into OUTDIR/summary.json and a table is printed (<= 8 files in OUTDIR).
# Missing Python packages (ray, omegaconf, pyzmq ...) are reported first; carry them as wheels (see
# /work/.library/device/README.md) and put them on PYTHONPATH before calling this.
set -u
OUT=${1:?usage: scripts/gpu/run_all.sh OUTDIR [tests] [arith] [perf] [sync7b]}
shift
PARTS=${*:-tests arith perf sync7b}
DEVICE=${DEVICE:-cuda}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAY_DISABLE_USAGE_STATS=1
cd "$REPO" || exit 1

echo "== environment"
$PY - "$REPO/pyproject.toml" <<'EOF'
import importlib.metadata as md, re, sys, tomllib
# every runtime dependency of pyproject.toml, by its distribution name (a package carried as a wheel
# with pip --target has its dist-info beside it), plus pytest for the tests part
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"] + ["pytest"]
missing = []
for req in deps:
    name = re.match(r"[A-Za-z0-9_.\-]+", req).group(0)
    try:
        print(f"  {name:13s} {md.version(name)}")
    except md.PackageNotFoundError:
        missing.append(name)
        print(f"  {name:13s} MISSING")
import torch
print(f"  cuda devices  {torch.cuda.device_count()}  {torch.cuda.get_device_name(0) if torch.cuda.is_available() else ''}")
if missing:
    print(f"  missing packages: {missing} (carry them as cp312 wheels; pyzmq only makes the NCCL metadata channel "
          "faster, the rest are imported by the runs)")
EOF

run_part() {  # name timeout_s command...
  local name=$1 limit=$2; shift 2
  echo "== $name (timeout ${limit}s)"
  local t0=$SECONDS
  timeout --signal=TERM --kill-after=30 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "   $name: exit $rc after $((SECONDS - t0)) s; last lines:"
  tail -n 3 "$OUT/$name.log" | sed 's/^/     /'
  echo "$rc" > "$OUT/$name.rc"
  # a killed run may leave its local Ray cluster behind, holding the GPUs the next part needs (only on the
  # dedicated GPU machine: on a shared CPU box other people's Ray clusters must live)
  if [ "$rc" -ne 0 ] && [ "$DEVICE" = cuda ]; then ray stop --force > /dev/null 2>&1; fi
  return 0
}

for part in $PARTS; do
  case $part in
    tests)
      if [ "$DEVICE" = cuda ]; then
        GPU_TESTS="tests/test_gpu_sync.py tests/test_gpu_trainer.py tests/test_gpu_wiring.py"
      else
        GPU_TESTS="tests/test_gpu_trainer.py tests/test_gpu_wiring.py"
      fi
      run_part tests 420 $PY -m pytest -q -p no:cacheprovider -rs $GPU_TESTS tests/test_nccl_engine_cpu.py \
        tests/test_api.py tests/test_versions.py tests/test_placement.py ;;
    arith)  run_part arith 330 $PY scripts/gpu/arith_2gpu.py --out "$OUT" --device "$DEVICE" --budget-s 180 ;;
    perf)   run_part perf 330 $PY scripts/gpu/pipeline_perf.py --out "$OUT" --device "$DEVICE" --budget-s 150 ;;
    sync7b) run_part sync7b 240 $PY scripts/gpu/sync7b.py --out "$OUT" --device "$DEVICE" ;;
    *) echo "unknown part $part (tests | arith | perf | sync7b)" ;;
  esac
done

echo "== summary"
$PY scripts/gpu/summarize.py "$OUT"
