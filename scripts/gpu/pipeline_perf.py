"""Acceptance run (b): a Qwen2.5-0.5B-shaped model (random init, bf16) through the whole pipeline on 2 GPUs.

    python scripts/gpu/pipeline_perf.py --out OUTDIR [--budget-s 150] [--seq 4096] [--device cuda|cpu]

Trainer: FSDP2 on one GPU (micro-batch 8, compiled layers, no reshard after forward: the best variant of
benchmarks/RESULTS.md); rollout: the hf backend on the other GPU (``load_format=dummy``: the initial
sync delivers the weights); NCCL sync every step; fully async (staleness 1, partial rollout). A
random model never emits EOS, so every response runs to ``--seq`` tokens minus the prompt (the
synthetic-length workload). 8 sequences per step (n=4 x 2 prompts).

Reports, from the trainer's and rollouter's own metrics in the run: trainer tokens/s and MFU while
updating (``timing/update_s``) and over the wall clock, in-pipeline sync time per step (pause +
transfer + load + resume, as the rollout sees it, and the transfer alone), trainer and rollouter idle
ratios, rollout tokens/s. Checks: MFU while updating >= 35%, median rollout-visible stall <= 60 ms
(the 7B-shaped stall is ``sync7b.py``). Writes ``OUTDIR/perf.json``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import common


def main(args: argparse.Namespace, result: dict) -> None:
    from asyncrl.config import load_config
    from asyncrl.experiment import Experiment
    from asyncrl.models import load_tokenizer
    from asyncrl.recipes import arith_grpo_cpu

    cuda = args.device == "cuda"
    shape = common.QWEN25_05B if cuda else common.TINY
    seq = args.seq if cuda else 96
    model = common.save_model(Path(tempfile.mkdtemp(prefix="asyncrl-05b-")), shape, "bfloat16" if cuda else "float32",
                              max_positions=seq + 64)
    keys = [f"actor_rollout_ref.model.path={model}", f"actor_rollout_ref.model.dtype={'bfloat16' if cuda else 'float32'}",
            "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl", "actor_rollout_ref.rollout.load_format=dummy",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.n=4",
            "async_training.require_batches=1", "async_training.staleness_threshold=1.0",
            "async_training.partial_rollout=true", "actor_rollout_ref.actor.ppo_micro_batch_size=8",
            "async_training.sync_bucket_size_mb=1024", "data.max_prompt_length=64",
            f"actor_rollout_ref.rollout.response_length={seq - 64}", f"actor_rollout_ref.rollout.max_model_len={seq}",
            "trainer.test_freq=0", "data.val_size=1", f"trainer.total_time_s={args.budget_s}",
            "trainer.total_training_steps=1000", "trainer.default_local_dir=/tmp/asyncrl-gpu-runs", "trainer.progress_bar=false"]
    if cuda:
        keys += ["trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1", "actor_rollout_ref.rollout.enforce_eager=false",
                 "actor_rollout_ref.actor.fsdp_config.use_torch_compile=true",
                 "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=false"]
    else:
        keys += ["trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=2",
                 "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.backend=gloo"]
    cfg = load_config(base=arith_grpo_cpu(), overrides=keys)
    result["overrides"], result["shape"] = keys, shape
    tok = load_tokenizer(str(model))
    from asyncrl.data.dataset import get_task_rows
    rows = get_task_rows("arith", "train", 64, 0, "+")
    prompt_mean = sum(len(tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True)) for r in rows) / len(rows)
    summary, trainer, rollouter = common.drive(Experiment(cfg), deadline_s=args.budget_s + args.grace_s)
    if summary is None:
        raise TimeoutError(f"the run did not finish within {args.budget_s + args.grace_s:.0f} s: trainer at step "
                           f"{trainer['global_steps']}, idle ratio {trainer['idle_ratio']:.2f}, rollouter "
                           f"accounting {rollouter['accounting']}")
    hist = trainer["history"][1:] or trainer["history"]  # the first step compiles
    rows_per_step = 2 * 4
    per_step = []
    for r in hist:
        resp = r["response_length/mean"]
        s = int(round(prompt_mean + resp))
        flops = common.train_flops(shape, [s] * rows_per_step, [int(resp)] * rows_per_step)
        per_step.append((flops, rows_per_step * s, r["timing/update_s"], r["timing/step_s"]))
    upd_s = sum(p[2] for p in per_step)
    step_s = sum(p[3] for p in per_step)
    flops, tokens = sum(p[0] for p in per_step), sum(p[1] for p in per_step)
    stall = [r.get("sync/pause_s", 0) + r.get("sync/transfer_total_s", 0) + r.get("sync/resume_s", 0) for r in hist]
    result.update(
        steps=summary.steps, measured_steps=len(per_step), prompt_len_mean=prompt_mean,
        response_len_mean=common.median([r["response_length/mean"] for r in hist]),
        trainer_tokens_per_s_updating=tokens / max(upd_s, 1e-9), trainer_tokens_per_s_wall=tokens / max(step_s, 1e-9),
        mfu_updating=flops / max(upd_s, 1e-9) / common.H200_BF16_PEAK,
        mfu_wall=flops / max(step_s, 1e-9) / common.H200_BF16_PEAK,
        sync_stall_ms_median=1e3 * common.median(stall),
        sync_pause_ms_median=1e3 * common.median([r.get("sync/pause_s") for r in hist]),
        sync_transfer_ms_median=1e3 * common.median([r.get("sync/transfer_total_s") for r in hist]),
        sync_engine_transfer_ms_median=1e3 * common.median([r.get("sync/engine/transfer_s") for r in hist]),
        sync_resume_ms_median=1e3 * common.median([r.get("sync/resume_s") for r in hist]),
        sync_bytes=hist[-1].get("sync/bytes") if hist else None,
        trainer_idle_ratio=trainer["idle_ratio"], rollouter_idle_ratio=rollouter["idle_ratio"],
        rollout_tokens_per_s=sum(r["response_length/mean"] * rows_per_step for r in trainer["history"])
        / max(summary.wall_s, 1e-9),
        accounting=summary.accounting, stop_reason=summary.stop_reason)
    result["checks"] = {"accounting_balanced": bool(summary.accounting.get("balanced")),
                        "trained_steps": summary.steps >= 2}
    if cuda:
        result["checks"].update(mfu_updating_ge_35pct=result["mfu_updating"] >= 0.35,
                                sync_stall_le_60ms=result["sync_stall_ms_median"] <= 60.0)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--budget-s", type=float, default=150.0, help="trainer.total_time_s")
    p.add_argument("--seq", type=int, default=4096, help="tokens per sequence (prompt + response)")
    p.add_argument("--grace-s", type=float, default=90.0, help="start, final sync and evaluation beyond the budget")
    a = p.parse_args()
    raise SystemExit(common.run_main("perf", a.out, lambda r: main(a, r)))
