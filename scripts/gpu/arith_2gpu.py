"""Acceptance run (a): the embedded arith recipe, rollout (hf backend) on GPU 0, FSDP2 trainer on GPU 1, NCCL sync.

    python scripts/gpu/arith_2gpu.py --out OUTDIR [--budget-s 200] [--device cuda|cpu]

The config is the CPU quickstart's (``arith_grpo_cpu``) plus the GPU keys, nothing else:

    actor_rollout_ref.actor.strategy=fsdp2 trainer.n_gpus_per_node=1 rollout.n_gpus_per_node=1
    actor_rollout_ref.rollout.name=hf actor_rollout_ref.rollout.checkpoint_engine.backend=nccl

plus ``checkpoint_engine.verify_each_sync=true`` (every tensor compared by SHA-256 in the replica after
every sync; the run fails on a difference) and ``trainer.total_time_s`` = the budget. Checks: held-out
greedy accuracy gains >= 30 points, prompt accounting balanced, no trained token older than the
staleness bound, every sync verified. ``--device cpu``: the same code at smoke size (FSDP2 over gloo,
hf on CPU, the nccl engine over gloo); only the invariants are checked, not learning.
Writes ``OUTDIR/arith.json``.
"""

from __future__ import annotations

import argparse

import common

GPU_KEYS = ["actor_rollout_ref.actor.strategy=fsdp2", "trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
            "actor_rollout_ref.rollout.enforce_eager=false"]
CPU_KEYS = ["actor_rollout_ref.actor.strategy=fsdp2", "trainer.device=cpu", "trainer.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
            "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.backend=gloo",
            "trainer.total_training_steps=3", "trainer.test_freq=2", "data.val_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=4"]


def main(args: argparse.Namespace, result: dict) -> None:
    from asyncrl.config import load_config
    from asyncrl.experiment import Experiment
    from asyncrl.recipes import arith_grpo_cpu

    keys = (GPU_KEYS if args.device == "cuda" else CPU_KEYS) + [
        "actor_rollout_ref.rollout.checkpoint_engine.verify_each_sync=true", f"trainer.total_time_s={args.budget_s}",
        "trainer.default_local_dir=/tmp/asyncrl-gpu-runs", "trainer.progress_bar=false"]
    if args.device == "cuda":
        keys.append("trainer.total_training_steps=1000")  # the time budget ends it
    cfg = load_config(base=arith_grpo_cpu(), overrides=keys)
    result["overrides"] = keys
    summary, trainer, rollouter = common.drive(Experiment(cfg), deadline_s=args.budget_s + args.grace_s)
    if summary is None:
        raise TimeoutError(f"the run did not finish within {args.budget_s + args.grace_s:.0f} s: trainer at step "
                           f"{trainer['global_steps']}, idle ratio {trainer['idle_ratio']:.2f}, rollouter "
                           f"accounting {rollouter['accounting']}")
    hist = trainer["history"]
    verified = [r.get("sync/verified_tensors", 0) for r in hist if "sync/total_s" in r]
    lags = {int(k): v for k, v in summary.lag_counts.items()}
    before, after = summary.accuracy_before or 0.0, summary.accuracy_after or 0.0
    result.update(
        accuracy_before=before, accuracy_after=after, gain_points=100 * (after - before), steps=summary.steps,
        syncs=summary.param_version, train_wall_s=summary.wall_s, stop_reason=summary.stop_reason,
        accounting=summary.accounting, lag_counts=lags, staleness_bound=summary.staleness_bound,
        evals=[(e["version"], e["accuracy"]) for e in summary.evals], verified_tensors_per_sync=verified,
        trainer_idle_ratio=trainer["idle_ratio"], rollouter_idle_ratio=rollouter["idle_ratio"],
        step_s_median=common.median([r.get("timing/step_s") for r in hist]),
        sync_total_s_median=common.median([r.get("sync/total_s") for r in hist]),
        sync_transfer_s_median=common.median([r.get("sync/engine/transfer_s") for r in hist]))
    result["checks"] = {
        "accounting_balanced": bool(summary.accounting.get("balanced")),
        "no_failed_samples": summary.accounting.get("failed_total", 1) == 0,
        "lag_within_bound": bool(lags) and max(lags) <= summary.staleness_bound,
        "every_sync_verified_bit_exact": bool(verified) and all(v > 0 for v in verified),
    }
    if args.device == "cuda":
        result["checks"]["learned_30_points"] = result["gain_points"] >= 30.0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--budget-s", type=float, default=180.0, help="trainer.total_time_s (training wall clock)")
    p.add_argument("--grace-s", type=float, default=90.0, help="start, final sync and evaluation beyond the budget")
    a = p.parse_args()
    raise SystemExit(common.run_main("arith", a.out, lambda r: main(a, r)))
