"""Colocated vs fully async, side by side in one run on one machine, with the ideal overlap bound.

For each mode the same task, batch, n and lr run for ``--steps`` trainer steps (or ``--time`` s):

* ``colocated``: ``actor_rollout_ref.hybrid_engine=True`` (generate the whole batch, train, sync, in
  turn); CPU: both phases on every core (vLLM unbound, ``trainer.torch_threads`` = cores);
* ``a`` ``b`` ``c`` ``d`` (DESIGN.md section 4), ``keep`` (mode d with ``partial_rollout_mode=keep``),
  ``d_s1`` / ``d_s2`` (staleness 1 / 2: one / two whole batches of look-ahead; ``d_s1_early``: d_s1 with groups past
  the staleness bound dropped at their resubmission, ``drop_stale_in_generation=True``; ``d_s2_c32``: d_s2's bound with
  at most 32 groups in generation; ``d_s1_m32`` / ``d_s1_m48``: d_s1 with 32 / 48 decode seats, ``rollout.max_num_seqs``,
  each on a replica of its own; ``d_s1_p32`` / ``d_s1_p48`` / ``d_s1_p64``: the same seated oldest sample first,
  ``rollout.scheduling_policy=priority``; ``d_s1_keep`` / ``d_s1_keep_m48``: d_s1 / d_s1_m48 with
  ``partial_rollout_mode=keep``), ``d_t2`` (two updates per sync; ``d_s1_t2`` staleness 1 too, ``d_s1_t2_c16`` / ``d_s1_t2_c32``: with at most
  16 / 32 groups in generation): the replica on
  core 0, the trainer and the glue (rollouter, queue: ``async_training.rollouter_cpu_affinity``; ``d_t2_float`` /
  ``d_s1_t2_float``: the glue floating; with vLLM, its front end there too, ``d_t2_front0`` / ``d_s1_t2_front0``:
  beside the engine) on core 1 (CPU; on more cores the replica on the first half, the trainer on
  the rest), or the replica on GPU 0 and the trainer on GPU 1 (``--gpu``);
* the A/B modes of d: ``d_stream`` (vLLM streams every token), ``d_percall`` / ``d_coalesce`` (one Ray call
  per engine request / a group's requests in one streamed call, ``agent.coalesce_group_requests``),
  ``d_before`` (streamed tokens, one call per request: the rollout before the coalesced calls), ``d_c8`` / ``d_c16``
  (at most 8 / 16 prompt groups in generation), ``d_c16_t2`` (and the trainer on both cores), ``d_c24``,
  ``d_dyn`` (verl's ``use_dynamic_bsz``), ``d_unpinned`` (nothing pinned, as ``make demo`` places it);
* the A/B modes of colocated: ``colocated_replica`` (hf: the engine in a replica actor, not the trainer's
  process), ``colocated_1t`` (one torch thread), ``colocated_spin`` / ``colocated_passive`` (the trainer's idle
  OpenMP threads spin OpenMP's default ~3 ms / sleep at once; the default: ``active`` for ~10 us, ``trainer.omp_*``),
  ``colocated_dyn`` (``use_dynamic_bsz``). ``MODES`` below holds each one's config keys.

Then rollout-only (the replica alone generates the workload at mode d's concurrency, and at every other
async mode's ``max_concurrent_samples``: the fastest counts) and train-only (the train engine alone updates on
those responses) throughput on the async resources give the ideal bound ``1 / max(rollout s/sample, train
s/sample)`` that overlap can at best reach. Printed per mode:
samples/s (prompt groups trained per second of training), x colocated, fraction of the ideal bound,
trainer / rollouter idle ratios, median step time, version lag, and the time until the rolling mean
reward reaches ``--target-reward``, the per-step split (fetch wait / update / sync parts) and the
rollouter's funnel (engine requests in flight, active groups, ``staleness_samples``). ``--census``
adds every process's CPU seconds, cores and thread affinities (``cpu_census.py``), the share of the trainer's
cores the rest took (the glue, vLLM's front end, Ray), and, with the ideal bound, the bound priced with it
(``1 / (train-only s/sample + their CPU s per sample)``: how much of the gap to the ideal bound is that CPU).
The simulator is
calibrated on micro-measurements (decode probes, train-only, each alone and with the other side busy:
the contention term) and predicts every mode. ``--json`` keeps everything.

Usage (CPU; start Ray, two vLLM engines, ~3 min per mode at the default size)::

    python benchmarks/async_vs_colocate.py                           # long-tail task, colocated + a-d
    python benchmarks/async_vs_colocate.py --modes colocated,d --steps 40 --json lt.json
    python benchmarks/async_vs_colocate.py --modes colocated,d,d_s1 --steps 16 --repeats 3   # ratios with their spread
    python benchmarks/async_vs_colocate.py --modes d --census --no-ideal --no-simulate   # where the CPU goes
    python benchmarks/async_vs_colocate.py --task arith --modes d --steps 60   # the demo's step time
    python benchmarks/async_vs_colocate.py --task arith --modes d --backend hf
    python benchmarks/async_vs_colocate.py --task arith --modes d --reference ../shared/baselines/rlproto
    python benchmarks/async_vs_colocate.py --gpu --backend hf --modes colocated,d   # 2 GPUs, no vLLM
    python benchmarks/async_vs_colocate.py --gpu --simulate-only --steps 12      # no GPU: predicted (gpu_sim.py)
    python benchmarks/async_vs_colocate.py --simulate-only --calibration lt.json  # a saved CPU run re-simulated

With ``--gpu`` the simulator predicts from the documented H200 cost model instead of CPU calibration
(``gpu_sim.py``, ``asyncrl.sim.presets.h200_qwen25_05b_hf``).

On a shared machine the absolute numbers move with the load; the ratios are measured side by side.
"""

from __future__ import annotations

import argparse
import collections
import asyncio
import dataclasses
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
CENSUS: Any = None
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MODES = {
    "colocated": {"actor_rollout_ref.hybrid_engine": True, "async_training.staleness_threshold": 0.0},
    # the same, its engine in a replica actor: with --backend hf on CPU, "colocated" runs the rollout in
    # the trainer process over the actor's module (asyncrl/trainer/hybrid_rollout.py); this is the path before
    "colocated_replica": {"actor_rollout_ref.hybrid_engine": True, "async_training.staleness_threshold": 0.0},
    # colocated with one torch thread (on a loaded 2-core box two OpenMP threads can lose more than they give)
    "colocated_1t": {"actor_rollout_ref.hybrid_engine": True, "async_training.staleness_threshold": 0.0,
                     "trainer.torch_threads": 1},
    # colocated with OpenMP's default wait policy in the trainer (idle threads spin ~3 ms; before session 9)
    "colocated_spin": {"actor_rollout_ref.hybrid_engine": True, "async_training.staleness_threshold": 0.0,
                       "trainer.omp_wait_policy": "''", "trainer.omp_spin_count": "null"},
    # colocated with idle OpenMP threads asleep at once (the trainer's default in sessions 9-27)
    "colocated_passive": {"actor_rollout_ref.hybrid_engine": True, "async_training.staleness_threshold": 0.0,
                          "trainer.omp_wait_policy": "passive"},
    "a": {"async_training.trigger_parameter_sync_step": 1, "async_training.staleness_threshold": 0.0},
    "b": {"async_training.trigger_parameter_sync_step": 2, "async_training.staleness_threshold": 0.0},
    "c": {"async_training.staleness_threshold": 0.5, "async_training.partial_rollout": False},
    "d": {"async_training.staleness_threshold": 0.5, "async_training.partial_rollout": True},
    "keep": {"async_training.staleness_threshold": 0.5, "async_training.partial_rollout": True,
             "async_training.partial_rollout_mode": "keep"},
    # colocated with verl's use_dynamic_bsz: micro-batches packed by a token budget (--gpu: the row
    # micro-batch's budget, GPU_MICRO_BATCH_TOKENS), each cut to its longest row, instead of fixed rows padded
    "colocated_dyn": {"actor_rollout_ref.hybrid_engine": True, "async_training.staleness_threshold": 0.0,
                      "actor_rollout_ref.actor.use_dynamic_bsz": True},
    "d_dyn": {"async_training.staleness_threshold": 0.5, "async_training.partial_rollout": True,
              "actor_rollout_ref.actor.use_dynamic_bsz": True},
    # mode d with more look-ahead: a whole batch (staleness 1), or two updates per sync
    "d_s1": {"async_training.staleness_threshold": 1.0, "async_training.partial_rollout": True},
    # two batches of look-ahead: d_s1 sits at its budget (staleness_samples 64 of 64) with the trainer idle half
    # the time; session 19 measured d_s2 with 1.5x the requests in the engine and no more samples/s (RESULTS.md)
    "d_s2": {"async_training.staleness_threshold": 2.0, "async_training.partial_rollout": True},
    # d_s2's bound (3) with d_s1's groups in flight: session 21 measured d_s2 at 169 sequences per iteration (d_s1:
    # 54), each response slower, 54 long-tail groups past even the wider bound (d_s1: 16)
    "d_s2_c32": {"async_training.staleness_threshold": 2.0, "async_training.partial_rollout": True,
                 "actor_rollout_ref.rollout.concurrent_samples_per_replica": 32},
    # d_s1 with a long-tail group past the staleness bound ending at its resubmission (stale_in_generation) instead
    # of generating on until the trainer drops it (stale_at_trainer): no gain in session 20's A/B rounds
    "d_s1_early": {"async_training.staleness_threshold": 1.0, "async_training.partial_rollout": True,
                   "async_training.drop_stale_in_generation": True},
    # d_s1 with fewer decode seats than sequences in flight (rollout.max_num_seqs), waiting requests seated in
    # arrival order (fcfs) or oldest sample first (rollout.scheduling_policy=priority): after a sync the resumed
    # long-tail responses, nearest the staleness bound, decode before the fresh groups, in smaller iterations
    "d_s1_m32": {"async_training.staleness_threshold": 1.0, "async_training.partial_rollout": True,
                 "actor_rollout_ref.rollout.max_num_seqs": 32},
    "d_s1_m48": {"async_training.staleness_threshold": 1.0, "async_training.partial_rollout": True,
                 "actor_rollout_ref.rollout.max_num_seqs": 48},
    "d_s1_p32": {"async_training.staleness_threshold": 1.0, "async_training.partial_rollout": True,
                 "actor_rollout_ref.rollout.max_num_seqs": 32, "actor_rollout_ref.rollout.scheduling_policy": "priority"},
    "d_s1_p48": {"async_training.staleness_threshold": 1.0, "async_training.partial_rollout": True,
                 "actor_rollout_ref.rollout.max_num_seqs": 48, "actor_rollout_ref.rollout.scheduling_policy": "priority"},
    "d_s1_p64": {"async_training.staleness_threshold": 1.0, "async_training.partial_rollout": True,
                 "actor_rollout_ref.rollout.max_num_seqs": 64, "actor_rollout_ref.rollout.scheduling_policy": "priority"},
    # d_s1 with PipelineRL's in-flight weight update: a sync freezes the requests with their KV cache instead of
    # aborting them (no re-prefill of each resumed long response; vLLM then streams every token)
    "d_s1_keep": {"async_training.staleness_threshold": 1.0, "async_training.partial_rollout": True,
                  "async_training.partial_rollout_mode": "keep"},
    "d_s1_keep_m48": {"async_training.staleness_threshold": 1.0, "async_training.partial_rollout": True,
                      "async_training.partial_rollout_mode": "keep", "actor_rollout_ref.rollout.max_num_seqs": 48},
    "d_t2": {"async_training.staleness_threshold": 0.5, "async_training.partial_rollout": True,
             "async_training.trigger_parameter_sync_step": 2},
    # staleness 1 with a sync every 2 steps: a version spans two steps' wall time, so a long response outlives
    # fewer versions (the bound is in versions; session 23)
    "d_s1_t2": {"async_training.staleness_threshold": 1.0, "async_training.partial_rollout": True,
                "async_training.trigger_parameter_sync_step": 2},
    # d_s1_t2 with PipelineRL's in-flight weight update (session 34): the simulator, with the prefill price, puts
    # the re-prefill of every resumed response at ~6% of this mode's samples/s
    "d_s1_t2_keep": {"async_training.staleness_threshold": 1.0, "async_training.partial_rollout": True,
                     "async_training.trigger_parameter_sync_step": 2, "async_training.partial_rollout_mode": "keep"},
    # d_s1_t2 with fewer prompt groups in generation at once: its staleness budget (128 groups, ~1,000 requests)
    # let the CPU engine fall behind in most session-32 runs (200+ sequences an iteration, long responses outliving
    # the bound); a group cap keeps the batch near where the engine kept up (43-103 sequences)
    "d_s1_t2_c16": {"async_training.staleness_threshold": 1.0, "async_training.partial_rollout": True,
                    "async_training.trigger_parameter_sync_step": 2,
                    "actor_rollout_ref.rollout.concurrent_samples_per_replica": 16},
    "d_s1_t2_c32": {"async_training.staleness_threshold": 1.0, "async_training.partial_rollout": True,
                    "async_training.trigger_parameter_sync_step": 2,
                    "actor_rollout_ref.rollout.concurrent_samples_per_replica": 32},
    # d_t2 / d_s1_t2 with the glue (rollouter, queue) left floating over both cores, as before session 32
    "d_t2_float": {"async_training.staleness_threshold": 0.5, "async_training.partial_rollout": True,
                   "async_training.trigger_parameter_sync_step": 2, "async_training.rollouter_cpu_affinity": "''"},
    "d_s1_t2_float": {"async_training.staleness_threshold": 1.0, "async_training.partial_rollout": True,
                      "async_training.trigger_parameter_sync_step": 2, "async_training.rollouter_cpu_affinity": "''"},
    # d_t2 / d_s1_t2 with vLLM's front end (the replica actor's process: admission, decoding each step's outputs and
    # log-probs) left on the engine's core, as before session 35 (rollout.frontend_with_glue)
    "d_t2_front0": {"async_training.staleness_threshold": 0.5, "async_training.partial_rollout": True,
                    "async_training.trigger_parameter_sync_step": 2, "actor_rollout_ref.rollout.frontend_with_glue": False},
    "d_s1_t2_front0": {"async_training.staleness_threshold": 1.0, "async_training.partial_rollout": True,
                       "async_training.trigger_parameter_sync_step": 2,
                       "actor_rollout_ref.rollout.frontend_with_glue": False},
    # mode d with the vLLM engine streaming every token to the replica actor (before session 10: one
    # output per token per request; now one per request, asyncrl.rollout.vllm_backend stream_outputs)
    "d_stream": {"async_training.staleness_threshold": 0.5, "async_training.partial_rollout": True},

    # mode d with one Ray call per engine request, or a group's 8 single-turn requests in one streamed call
    # (actor_rollout_ref.rollout.agent.coalesce_group_requests); d_before: per call and streamed tokens
    "d_percall": {"async_training.staleness_threshold": 0.5, "async_training.partial_rollout": True,
                  "actor_rollout_ref.rollout.agent.coalesce_group_requests": False},
    "d_coalesce": {"async_training.staleness_threshold": 0.5, "async_training.partial_rollout": True,
                   "actor_rollout_ref.rollout.agent.coalesce_group_requests": True},
    "d_before": {"async_training.staleness_threshold": 0.5, "async_training.partial_rollout": True,
                 "actor_rollout_ref.rollout.agent.coalesce_group_requests": False},
    # mode d with fewer prompt groups in generation at once (rollout.concurrent_samples_per_replica; default
    # 256, i.e. the whole staleness budget): right after a sync the groups the trainer waits for decode in a
    # smaller batch instead of beside the next step's look-ahead
    "d_c8": {"async_training.staleness_threshold": 0.5, "async_training.partial_rollout": True,
             "actor_rollout_ref.rollout.concurrent_samples_per_replica": 8},
    "d_c16": {"async_training.staleness_threshold": 0.5, "async_training.partial_rollout": True,
              "actor_rollout_ref.rollout.concurrent_samples_per_replica": 16},
    # d_c16 with the trainer on both cores (2 torch threads, OpenMP passive): the rollout core is idle for part
    # of each update (the look-ahead groups finish before it ends)
    "d_c16_t2": {"async_training.staleness_threshold": 0.5, "async_training.partial_rollout": True,
                 "actor_rollout_ref.rollout.concurrent_samples_per_replica": 16, "trainer.torch_threads": 2,
                 "trainer.cpu_affinity": "''"},
    "d_c24": {"async_training.staleness_threshold": 0.5, "async_training.partial_rollout": True,
              "actor_rollout_ref.rollout.concurrent_samples_per_replica": 24},
    # mode d placed as the recipe places it (`make demo`): nothing pinned, the replica's processes and the
    # trainer share both cores under the OS scheduler (the other async modes pin rollout to core 0, trainer to 1)
    "d_unpinned": {"async_training.staleness_threshold": 0.5, "async_training.partial_rollout": True},
}
UNPINNED = {"d_unpinned"}
"""Async modes that run on the unpinned ("shared") replica with the recipe's own placement."""

CPU_KEYS = ("trainer.torch_threads", "trainer.cpu_affinity", "trainer.omp_wait_policy", "trainer.omp_spin_count",
            "async_training.rollouter_cpu_affinity", "actor_rollout_ref.rollout.cpu_affinity",
            "actor_rollout_ref.rollout.frontend_with_glue")
"""Config keys that place or thread the CPU run only: a mode that sets one is an A/B of the CPU placement."""

ENGINE_ATTRS = {"d_stream": {"stream_outputs": True}, "d_before": {"stream_outputs": True}}
"""Attributes set on the shared replica's engine for one mode only (restored after it): engine internals
that are no user choice, A/B'd side by side on the same replica."""


def cpu_only(mode: str) -> bool:
    """Whether ``mode`` differs from the mode it is an A/B of only on CPU (its placement, threads or OpenMP waits:
    :data:`CPU_KEYS`; nothing pinned, ``UNPINNED``; the vLLM engine's outputs, ``ENGINE_ATTRS``; the hf engine in a
    replica actor, which ``--gpu`` colocated modes always are): with ``--gpu`` it would run as that mode, its ratio to
    it 1.00x by construction."""
    return (mode in UNPINNED or mode in ENGINE_ATTRS or mode == "colocated_replica"
            or any(k in CPU_KEYS for k in MODES[mode]))


GPU_MICRO_BATCH_TOKENS = 8 * (2048 + 64)
"""``--gpu``: tokens (rows x padded length) of one trainer micro-batch, at most 8 rows: what ran on one H200
beside the replica at max 2,048 tokens. 8 rows at 4,160 tokens (the default ``--gpu-max-tokens 4096``) ran
out of memory there in the backward (110 GB in the trainer, 2026-12-01: the 152k-vocabulary fp32 logits,
their log-softmax and gradient are ~19 GB each)."""


def gpu_micro_batch(max_tokens: int) -> int:
    """Rows per FSDP2 micro-batch for responses up to ``max_tokens`` (prompts up to 64 tokens)."""
    return max(1, min(8, GPU_MICRO_BATCH_TOKENS // (max_tokens + 64)))


def base_config(args: argparse.Namespace):
    """The task's recipe at benchmark size (evaluation off: it would steal the rollout's time)."""
    from asyncrl.config import load_config
    from asyncrl.recipes import arith_grpo_cpu, longtail_grpo_cpu

    cfg = longtail_grpo_cpu() if args.task == "longtail" else arith_grpo_cpu()
    if args.gpu:  # a random-init model of Qwen2.5-0.5B's shape, the embedded tokenizer, synthetic lengths
        cfg.actor_rollout_ref.model.path = gpu_model(args)
        cfg.actor_rollout_ref.model.tokenizer_path = str(REPO / "asyncrl" / "models" / "tiny_qwen2_arith")
        cfg.actor_rollout_ref.model.dtype = "bfloat16"
        cfg.data.task, cfg.data.max_prompt_length = "arith", 64
        ro = cfg.actor_rollout_ref.rollout
        ro.response_length, ro.max_model_len = args.gpu_max_tokens, args.gpu_max_tokens + 64
        # CUDA-graph decode (verl's GPU default; the CPU recipe's enforce_eager ran a 1-GPU colocated step's
        # generation at ~57 ms per token, 2026-12-01)
        ro.enforce_eager = False
        lw = cfg.data.length_workload
        lw.distribution, lw.median, lw.sigma, lw.min_tokens = "lognormal", args.gpu_median_tokens, 1.0, 8
        # fp32 logits of one micro-batch are rows x tokens x 151,936 x 4 bytes: the CPU recipe's 64 rows at
        # 1,088 tokens asked for 26 GiB more on a full H200 (2026-11-30); rows by token budget (gpu_micro_batch)
        cfg.actor_rollout_ref.actor.ppo_micro_batch_size = gpu_micro_batch(args.gpu_max_tokens)
        # the H200 runs (tests/data/avc_gpu_*) split by rows, every row padded to the step's longest; the
        # fsdp2 engine packs by token budget too since 2026-12-01 (use_dynamic_bsz), not measured on a GPU yet
        cfg.actor_rollout_ref.actor.use_dynamic_bsz = False
        cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu = GPU_MICRO_BATCH_TOKENS  # for the *_dyn modes
    over = [f"trainer.total_training_steps={args.steps}", f"trainer.total_time_s={args.time}",
            "trainer.test_freq=0", "trainer.progress_bar=False", "data.val_size=4",
            f"actor_rollout_ref.rollout.name={args.backend}", f"trainer.default_local_dir={args.out}"]
    return load_config(base=cfg, overrides=over + list(args.set or []))


def gpu_model(args: argparse.Namespace) -> str:
    """A random-init Qwen2 of Qwen2.5-0.5B's shape (494M parameters), built once under ``--out``
    (``--simulate-only``: the embedded model's directory stands in; the simulator loads no weights)."""
    if getattr(args, "simulate_only", False):
        return str(REPO / "asyncrl" / "models" / "tiny_qwen2_arith")
    path = Path(args.out) / "random_qwen2.5-0.5b"
    if not (path / "config.json").exists():
        import torch
        import transformers

        cfg = transformers.Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                                       tie_word_embeddings=True, eos_token_id=258, bos_token_id=None, pad_token_id=256,
                                       rope_theta=1000000.0)
        torch.manual_seed(0)
        transformers.Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    return str(path)


def placement(mode: str, args: argparse.Namespace) -> list[str]:
    """Resource overrides: colocated shares everything, async splits rollout / trainer. On CPU the async modes split
    this process's cores in two halves (the rollout the first, one core on a 2-core box; the trainer the rest, with a
    torch thread per core), so both sides of the comparison use every core (they had cores 0 and 1 whatever the
    machine: on 8 cores, 2 against colocated's 8)."""
    allowed = sorted(os.sched_getaffinity(0))
    cores = len(allowed)
    if args.gpu:  # the GPU resource keys (verl fully-async split); colocated replicas share the trainer's GPUs
        if mode.startswith("colocated"):
            return ["actor_rollout_ref.actor.strategy=fsdp2", f"trainer.n_gpus_per_node={args.gpus}",
                    "rollout.n_gpus_per_node=0", "actor_rollout_ref.rollout.checkpoint_engine.backend=cuda_ipc"]
        if args.gpus < 2:
            raise SystemExit(f"--gpus {args.gpus}: mode {mode} splits the GPUs between rollout and trainer; "
                             "it needs --gpus 2 or more (only 'colocated' runs on one GPU)")
        half = args.gpus // 2
        return ["actor_rollout_ref.actor.strategy=fsdp2", f"trainer.n_gpus_per_node={args.gpus - half}",
                f"rollout.n_gpus_per_node={half}", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"]
    if mode in UNPINNED:
        return ["trainer.cpu_affinity=''", "actor_rollout_ref.rollout.cpu_affinity=''"]
    if mode.startswith("colocated") or cores < 2:
        return [f"trainer.torch_threads={cores}", "trainer.cpu_affinity=''", "actor_rollout_ref.rollout.cpu_affinity=''"]
    # the glue (rollouter, queue) follows the trainer's cores: async_training.rollouter_cpu_affinity's default "auto"
    rollout, trainer = allowed[:cores // 2], allowed[cores // 2:]
    return [f"trainer.torch_threads={len(trainer)}", f"trainer.cpu_affinity={','.join(map(str, trainer))}",
            f"actor_rollout_ref.rollout.cpu_affinity={','.join(map(str, rollout))}"]


def mode_config(mode: str, args: argparse.Namespace):
    from asyncrl.config import load_config

    over = placement(mode, args) + [f"{k}={v}" for k, v in MODES[mode].items()]  # a mode's own keys win
    return load_config(base=base_config(args), overrides=over)


def set_conflicts(args: argparse.Namespace, modes: Sequence[str]) -> list[str]:
    """The ``--set`` overrides a mode replaces with its own value (its placement or its ``MODES`` keys, applied after
    ``--set``: they define the comparison), one line each; ``[]`` when none. Values are compared as the config holds
    them (``2`` and ``2.0`` are one value); a key ``--set`` removes (``~key``) is not compared.

    Raises:
        ConfigError: from building the configs (an ``--set`` the config refuses).
    """
    from asyncrl.config_types import _get

    base = base_config(args)
    keys = []
    for item in args.set or []:
        key = item.partition("=")[0].strip().lstrip("+")
        if key and not key.startswith("~") and key not in keys:
            keys.append(key)
    lines = []
    for m in modes:
        cfg = mode_config(m, args)
        for key in keys:
            mine, theirs = _get(cfg, key), _get(base, key)
            if mine != theirs:
                lines.append(f"--set {key}={theirs!r} is replaced by mode {m}'s own {key}={mine!r} (a mode's "
                             "placement and keys define it): drop it from --set, or run a mode that has that value")
    return lines


def time_to_reward(history: list[dict], target: float, window: int = 5) -> Optional[float]:
    """Seconds of training until the rolling mean of ``reward/mean`` first reaches ``target``."""
    rewards = [r["reward/mean"] for r in history]
    for i in range(len(rewards)):
        lo = max(0, i - window + 1)
        if i + 1 >= window and sum(rewards[lo:i + 1]) / (i + 1 - lo) >= target:
            return history[i]["time_s"]
    return None


def run_mode(mode: str, replica: Any, args: argparse.Namespace) -> dict:
    import ray

    from asyncrl.experiment import Experiment
    from asyncrl.staleness import sample_budget

    cfg = mode_config(mode, args)
    saved = set_engine_attrs(replica, ENGINE_ATTRS.get(mode, {}))
    moved = place_frontend(replica, cfg, args)
    exp = Experiment(cfg, replicas=[replica] if replica is not None else None)
    t0 = time.time()
    census = None
    try:
        exp.start()
        if args.census:
            census = CENSUS
            census.mark(mode)
        funnel = FunnelSampler(exp.rollouter).start()
        summary = exp.wait(progress=False)
        funnel.stop()
        cpu = census.report(mode) if census else None
        status = ray.get(exp.trainer.status.remote())
        history = status["history"]
        ro = ray.get(exp.rollouter.snapshot.remote())
    finally:
        exp.stop()
        set_engine_attrs(replica, saved)
        if moved:  # back where the replica was built to have it (mode d's place), for the modes and bound after
            place_frontend(replica, mode_config("d", args), args, home=True)
    steady = history[pipeline_fill(history):]
    span = steady[-1]["time_s"] - steady[0]["time_s"] if len(steady) > 1 else 0.0
    req = sample_budget(cfg).required_samples
    lags = {int(k): v for k, v in summary.lag_counts.items()}
    out = {
        "mode": mode, "steps": len(history), "wall_s": time.time() - t0,
        "train_s": history[-1]["time_s"] if history else 0.0,
        "samples_per_s": (len(history) * req / history[-1]["time_s"]) if history else 0.0,
        "steady_samples_per_s": ((len(steady) - 1) * req / span) if span else 0.0,
        "step_s_median": statistics.median(r["timing/step_s"] for r in steady) if steady else 0.0,
        "fetch_s_median": statistics.median(r["timing/fetch_s"] for r in steady) if steady else 0.0,
        "update_s_median": statistics.median(r["timing/update_s"] for r in steady) if steady else 0.0,
        "trainer_idle_ratio": history[-1]["trainer/idle_ratio"] if history else 0.0,
        "rollouter_idle_ratio": ro["idle_ratio"],
        "lag_mean": sum(k * v for k, v in lags.items()) / max(1, sum(lags.values())),
        "lag_max": max(lags, default=0),
        "reward_first": statistics.fmean(r["reward/mean"] for r in history[:5]) if history else 0.0,
        "reward_last": statistics.fmean(r["reward/mean"] for r in history[-5:]) if history else 0.0,
        "time_to_target_s": time_to_reward(history, args.target_reward),
        "response_length_mean": statistics.fmean(r["response_length/mean"] for r in history) if history else 0.0,
        "response_length_counts": status.get("response_length_counts", {}),  # the workload its simulation draws from
        "gradient_length_counts": status.get("gradient_length_counts", {}),  # ... and the rows of it that trained
        "stale_length_counts": status.get("stale_length_counts", {}),  # ... and the rows generated, dropped stale
        "accounting_balanced": summary.accounting.get("balanced"),
        "step_split": step_split(steady),
        # the train price in this run (s per token through the model, FullyAsyncTrainer's perf/update_s_per_token)
        "train_price": (statistics.median(r["perf/update_s_per_token"] for r in steady)
                        if steady and all("perf/update_s_per_token" in r for r in steady) else None),
        "funnel": funnel.summary(),
        "engine": {**engine_summary(steady), **generation_cost(history, req * cfg.actor_rollout_ref.rollout.n,
                                                               summary.accounting.get("dropped", {}))},
        "history": history,
    }
    if cpu:
        out["census"] = cpu
        if cfg.trainer.cpu_affinity and not cfg.actor_rollout_ref.hybrid_engine:  # what else ran on the trainer's cores
            from cpu_census import cores_of, others_on_cores

            out["glue_on_trainer_cores"] = others_on_cores(cpu, cores_of(cfg.trainer.cpu_affinity), TRAINER_LABEL)
    print(f"  {mode:9s} {out['steps']:3d} steps  {out['samples_per_s']:.3f} samples/s  step {out['step_s_median']:.2f} s"
          f"  trainer idle {out['trainer_idle_ratio']:.2f}  rollouter idle {out['rollouter_idle_ratio']:.2f}", flush=True)
    print("    funnel (mean of 1 Hz samples): " + "  ".join(f"{k} {v:.1f}" for k, v in out["funnel"].items()), flush=True)
    if out["engine"]:
        print("    engine (median of steps): " + format_engine(out["engine"]), flush=True)
    if summary.stale_line():
        print("    " + summary.stale_line(), flush=True)
    print("    per step (median s): " + "  ".join(f"{k} {v:.3f}" for k, v in out["step_split"].items()), flush=True)
    if cpu:
        from cpu_census import format_report

        print(format_report(cpu), flush=True)
        g = out.get("glue_on_trainer_cores")
        if g:
            print(f"  on the trainer's cores ({cfg.trainer.cpu_affinity}) the rest took {g['share']:.2f} of their time: "
                  + ", ".join(f"{k} {v:.1f} s" for k, v in g["by_process"].items()), flush=True)
    return out


TRAINER_LABEL = "ray::FullyAsyncTrainer"


def priced_bounds(result: dict) -> dict:
    """``--census`` with the ideal bound: per pinned async mode, the bound priced with what else ran on the trainer's
    cores (the glue, vLLM's front end, Ray's daemons). Their CPU per trained sample in the mode's run (their share of
    those cores / the mode's samples/s) is added to train-only's seconds per sample: those cores must do both for
    every sample, so the training side can at best reach ``1 / (train-only s/sample + theirs)``, against the same
    rollout-only. The ideal bound prices the training with the trainer's cores to itself, which no run that places
    the glue there has; this one says how much of the gap to it is that CPU (``of_priced`` near 1: the overlap itself
    leaves little). The rollout side is not priced (its front end's share of the trainer's cores slows it too).
    Returns ``{mode: {"share", "glue_s_per_sample", "train_samples_per_s", "bound_samples_per_s", "of_priced"}}``;
    ``{}`` without them."""
    ideal = result.get("ideal") or {}
    if not ideal.get("train_s_per_sample"):
        return {}
    rollout = 1.0 / ideal.get("best_rollout_s_per_sample", ideal["rollout_s_per_sample"])
    out = {}
    for m, r in result.get("modes", {}).items():
        g = r.get("glue_on_trainer_cores")
        if not g or not r.get("samples_per_s"):
            continue
        glue = g["share"] / r["samples_per_s"]
        train = 1.0 / (ideal["train_s_per_sample"] + glue)
        bound = min(rollout, train)
        out[m] = {"share": g["share"], "glue_s_per_sample": glue, "train_samples_per_s": train,
                  "bound_samples_per_s": bound, "of_priced": r["samples_per_s"] / bound}
    return out


def place_frontend(replica: Any, cfg: Any, args: argparse.Namespace, home: bool = False) -> bool:
    """Put ``replica``'s front end (its actor's process: vLLM's ``AsyncLLM``) where ``cfg`` places it: the glue's cores
    (:func:`asyncrl.cpu_affinity.frontend_cores`) or, with ``actor_rollout_ref.rollout.frontend_with_glue=false``,
    the replica's own. The replicas are shared by the modes of one placement, and the key acts once the engine has
    started, so the A/B modes (``d_t2_front0`` ...) move it for their run; returns whether it moved from where
    mode d's config (the replica's) has it. ``home=True`` (after such a mode) moves it there unconditionally: the
    restore used to compare mode d's place with itself and moved nothing, so every mode after a ``*_front0`` mode
    in a round, and the round's ideal bound, ran with the front end beside the engine (session 35's runs)."""
    if replica is None or args.gpu:
        return False
    from asyncrl.cpu_affinity import frontend_cores, pin_actors
    from asyncrl.rollout.backends import get_backend_cls

    backend = get_backend_cls(replica.backend)
    spec = frontend_cores(cfg, backend) or cfg.actor_rollout_ref.rollout.cpu_affinity
    d = mode_config("d", args)
    there = frontend_cores(d, backend) or d.actor_rollout_ref.rollout.cpu_affinity
    if cfg.actor_rollout_ref.rollout.cpu_affinity and (home or spec != there):
        pin_actors([replica.actor], spec)
        return True
    return False


def set_engine_attrs(replica: Any, attrs: dict) -> dict:
    """Set ``attrs`` on ``replica``'s engine (in its actor); returns the values they replace."""
    if not attrs or replica is None:
        return {}
    import ray

    def swap(actor_self: Any, new: dict) -> dict:
        old = {k: getattr(actor_self.engine, k) for k in new}
        for k, v in new.items():
            setattr(actor_self.engine, k, v)
        return old

    return ray.get(replica.actor.__ray_call__.remote(swap, attrs))


class FunnelSampler:
    """Polls the rollouter once a second: requests in flight at the engines (sequences decoding or
    waiting), active prompt groups, ``staleness_samples`` and whether admission is paused."""

    def __init__(self, rollouter: Any, interval: float = 1.0):
        import threading

        self.rollouter, self.interval, self.rows = rollouter, interval, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> "FunnelSampler":
        self._thread.start()
        return self

    def _loop(self) -> None:
        import ray

        while not self._stop.wait(self.interval):
            try:
                s = ray.get(self.rollouter.snapshot.remote(), timeout=10)
            except Exception:  # the run ended
                return
            self.rows.append({"engine_requests": s["load_balancer"].get("total_in_flight", 0),
                              "active_groups": s["active_tasks"], "staleness_samples": s["staleness_samples"],
                              "paused": float(bool(s["paused"]))})

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def summary(self) -> dict:
        rows = self.rows[2:] or self.rows
        return {k: statistics.fmean(r[k] for r in rows) for k in rows[0]} if rows else {}


ENGINE_KEYS = ("busy_ratio", "batch_mean", "decode_ms", "tokens_per_s")


def engine_summary(rows: list[dict]) -> dict:
    """Medians over ``rows`` of the engines' ``rollout/engine_*`` (:mod:`asyncrl.rollout.engine_stats`): is
    the replica underfed (low busy ratio, small batches) or slowed (decode ms above rollout-only's)?"""
    keys = [k for k in ENGINE_KEYS if rows and all(f"rollout/engine_{k}" in r for r in rows)]
    return {k: statistics.median(r[f"rollout/engine_{k}"] for r in rows) for k in keys}


def generation_cost(history: list[dict], responses_per_step: int, dropped: Optional[dict] = None) -> dict:
    """What the run's generation cost beyond what it trained: the engines' tokens over the trained tokens
    (``rollout/engine_generated_tokens`` summed over the rows against ``response_length/mean`` x responses)
    and the prompt groups dropped as stale, at the trainer and (``dropped``: the run's accounting) in generation.
    ``{}`` without engine statistics."""
    if not history or not all("rollout/engine_generated_tokens" in r for r in history):
        return {}
    trained = sum(r["response_length/mean"] * responses_per_step for r in history)
    return {"tokens_per_trained_token": sum(r["rollout/engine_generated_tokens"] for r in history) / max(1e-9, trained),
            "dropped_stale": history[-1].get("trainer/dropped_stale", 0),
            "dropped_stale_in_generation": (dropped or {}).get("stale_in_generation", 0)}


def format_engine(e: dict) -> str:
    out = (f"busy {e.get('busy_ratio', 0):.2f}  batch {e.get('batch_mean', 0):.1f} seqs  "
           f"decode {e.get('decode_ms', 0):.1f} ms/iteration  {e.get('tokens_per_s', 0):,.0f} tokens/s")
    if "tokens_per_trained_token" in e:
        out += (f"; whole run: {e['tokens_per_trained_token']:.2f} tokens generated per token trained, groups dropped"
                f" stale {e['dropped_stale']:.0f} at the trainer + {e.get('dropped_stale_in_generation', 0):.0f} in generation")
    return out


def pipeline_fill(history: list[dict]) -> int:
    """How many first steps a step split leaves out: the pipeline's fill (2, fewer in a short run)."""
    return min(2, max(0, len(history) - 3))


def step_split(rows: list[dict]) -> dict:
    """Median seconds per trainer step: waiting for the batch (``gen`` in colocated mode, ``fetch``),
    the update (reward .. optimizer), the sync's parts, and the rest (logging, Ray calls between)."""
    keys = {"gen": "timing/gen_s", "fetch": "timing/fetch_s", "update": "timing/update_s",
            "collate": "timing/collate_s", "adv": "timing/adv_s", "update_actor": "timing/update_actor_s",
            "update_post": "timing/update_post_s",
            "sync_pause": "sync/pause_s", "sync_transfer": "sync/transfer_s", "sync_resume": "sync/resume_s",
            "sync": "sync/total_s", "step": "timing/step_s"}
    out = {k: statistics.median(r.get(v, 0.0) for r in rows) for k, v in keys.items() if rows and any(v in r for r in rows)}
    if rows:
        rest = [r["timing/step_s"] - r.get("timing/gen_s", 0.0) - r["timing/fetch_s"] - r["timing/update_s"]
                - r.get("sync/total_s", 0.0) for r in rows]
        out["other"] = statistics.median(rest)
    return out


def rollout_only_concurrencies(modes: Sequence[str], args: argparse.Namespace) -> dict[int, str]:
    """``{max_concurrent_samples: the first mode with it}`` over mode d and the async ``modes`` that run on the split
    replica (a mode with an engine start key of its own, e.g. ``d_s1_m48``, runs on another engine: left out), in
    increasing concurrency: the rollout-only measurements of :func:`ideal_bound`."""
    from asyncrl.staleness import sample_budget

    out: dict[int, str] = {}
    for m in ["d", *modes]:
        if not m.startswith("colocated") and replica_kind(m, args) == "split":
            out.setdefault(sample_budget(mode_config(m, args)).max_concurrent_samples, m)
    return dict(sorted(out.items()))


def ideal_bound(replica: Any, args: argparse.Namespace, modes: Sequence[str] = ()) -> dict:
    """Rollout-only and train-only throughput on the async resources (replica core 0, trainer core 1; on more cores
    the halves :func:`placement` gives them).

    The rollout-only runs at mode d's concurrency (its groups and seconds calibrate the simulator) and again at
    every other concurrency (``max_concurrent_samples``) of the async ``modes`` on the same replica: a larger budget
    puts more sequences in each decode iteration, and the engine's tokens/s depend on that (session 23: mode
    ``d_t2``'s 96 groups made 1.2x the tokens/s of mode d's 48 alone). The bound takes the fastest of them, so no
    mode is measured against a rollout-only slower than its own concurrency allows. Each measurement is kept in
    ``rollout_only`` (``concurrency``, ``groups``, ``s_per_sample``, ``engine``)."""
    import ray

    from asyncrl.data.dataset import get_task_rows
    from asyncrl.rollout.engine_stats import merge_windows, window_metrics
    from asyncrl.placement import trainer_env
    from asyncrl.sim.calibrate import measure_rollout, measure_train
    from asyncrl.staleness import sample_budget

    cfg = mode_config("d", args)
    rows = get_task_rows(cfg.data.task, "train", 512, cfg.trainer.seed + 7)
    asyncio.run(measure_rollout(replica, cfg, rows, 8))  # warm-up

    def rollout_only(mode_cfg: Any, groups: int) -> tuple[float, list, dict]:
        ray.get(replica.actor.iteration_stats.remote())  # the engine's window starts with the measurement
        gen_s, outputs = asyncio.run(measure_rollout(replica, mode_cfg, rows, groups))
        engine = window_metrics(merge_windows([ray.get(replica.actor.iteration_stats.remote())]), prefix="")
        return gen_s, outputs, {k: engine[k] for k in ENGINE_KEYS if k in engine}

    groups = args.ideal_groups
    gen_s, outputs, engine = rollout_only(cfg, groups)
    conc_d = sample_budget(cfg).max_concurrent_samples
    measured = [{"mode": "d", "concurrency": conc_d, "groups": groups, "s_per_sample": gen_s / groups, "engine": engine}]
    for conc, m in rollout_only_concurrencies(modes, args).items():
        if conc != conc_d:  # at least two budgets' worth of groups, so the start and the drain are not the whole run
            g = max(groups, 2 * conc)
            s, _, e = rollout_only(mode_config(m, args), g)
            measured.append({"mode": m, "concurrency": conc, "groups": g, "s_per_sample": s / g, "engine": e})
    # a fresh worker: it pins itself; the trainer actor's OpenMP settings (placement.trainer_env)
    train = ray.remote(num_cpus=0, max_calls=1)(measure_train).options(**trainer_env(cfg))
    t = ray.get(train.remote(cfg, outputs))
    best = min(measured, key=lambda x: x["s_per_sample"])
    rollout_s_per_sample, train_s_per_sample = gen_s / groups, t["s_per_sample"]
    out = {"rollout_s_per_sample": rollout_s_per_sample, "train_s_per_sample": train_s_per_sample,
           "best_rollout_s_per_sample": best["s_per_sample"], "best_concurrency": best["concurrency"],
           "ideal_samples_per_s": 1.0 / max(best["s_per_sample"], train_s_per_sample),
           "rollout_tokens": sum(len(o.token_ids) for _, _, outs, _ in outputs for o in outs), "rollout_s": gen_s,
           "groups": [[len(o.token_ids) for o in outs] for _, _, outs, _ in sorted(outputs, key=lambda x: x[0])],
           "engine": engine, "rollout_only": measured}
    for x in measured:
        print(f"  rollout-only, {x['groups']} groups with at most {x['concurrency']} at once ({x['mode']}'s budget): "
              f"{1 / x['s_per_sample']:.3f} samples/s" + (f"; engine {format_engine(x['engine'])}" if x["engine"] else ""),
              flush=True)
    print(f"  train-only {1 / train_s_per_sample:.3f} samples/s -> ideal {out['ideal_samples_per_s']:.3f} samples/s"
          f" (rollout-only at {best['concurrency']} groups)", flush=True)
    return out


def calibrate(replicas: dict, result: dict, args: argparse.Namespace) -> dict:
    """Micro-measurements for the simulator: decode probes per placement, train-only per placement,
    the workload's response lengths, and the contention term of the split placement (the same probe
    with the trainer busy on its core; train-only with the replica generating); then predict every
    measured mode (asyncrl.sim)."""
    import ray

    from asyncrl.agent_loop.single_turn import render_prompt_ids
    from asyncrl.placement import trainer_env
    from asyncrl.sim.calibrate import contention, measure_rollout, measure_train, probe_decode, rollout_only
    from asyncrl.sim.probes import long_prompt, probe_token_costs
    from asyncrl.staleness import sample_budget

    cfg = mode_config("d", args)
    tok, rows, prompt = probe_prompt(cfg)
    cal: dict[str, Any] = {"prompt_tokens": statistics.fmean(len(render_prompt_ids(tok, r["prompt"])) for r in rows[:64])}
    probe = {"batch_sizes": PROBE_BATCHES, "tokens": PROBE_TOKENS}
    cal["probe_prompt_tokens"] = len(prompt)
    long_tokens, note = long_probe_plan(calibration_context(args), len(prompt))  # check_args made sure it can run
    if note:
        print(f"  calibration: {note}", flush=True)
        cal["token_probe_note"] = note
    longer = long_prompt([render_prompt_ids(tok, r["prompt"]) for r in rows[:32]], long_tokens) if long_tokens else None
    for kind, rep in replicas.items():
        cal[f"decode_{kind}"] = asyncio.run(probe_decode(rep, prompt, **probe))
        print(f"  decode ms/iteration ({kind}): " + ", ".join(f"B={b}: {t * 1e3:.1f} ms" for b, t in cal[f'decode_{kind}'].items()),
              flush=True)
        if longer is None:
            continue
        # what a resumed partial rollout's prefill and a long response's context cost, beside the probe (session 34);
        # optional: a failure is a note (priced at 0), never a crash that loses the timed modes' calibration
        try:
            costs, cal[f"token_costs_{kind}"] = asyncio.run(probe_token_costs(rep, prompt, longer, cal[f"decode_{kind}"],
                                                                              PROBE_TOKENS))
        except ValueError as exc:  # PromptTooLong (through Ray too), a request cut at the context, a broken time
            cal["token_probe_note"] = f"prefill / context probes failed on the {kind} engine ({exc})"
            print(f"  calibration: {cal['token_probe_note']}", flush=True)
            continue
        print(f"  prefill {costs.per_prefill_token_s * 1e6:.1f} us per prompt token, decode {costs.per_ctx_token_s * 1e6:.3f} "
              f"us per context token an iteration ({kind}; one-token requests and the probe at {len(longer)} prompt tokens)"
              + "".join(f"; {n}" for n in costs.notes), flush=True)
    split = replicas.get("split") or replicas["shared"]
    ro_s, outputs = asyncio.run(measure_rollout(split, cfg, rows, 64))
    cal["response_lengths"] = [len(o.token_ids) for _, _, outs, _ in outputs for o in outs]
    cal["rollout_only"] = rollout_only(cfg, ro_s, outputs)  # timed, its groups in start order: what fit_per_request reproduces
    if "shared" in replicas and replicas["shared"] is not split:
        # the colocated engine on its own rollout-only: one whole batch (the same groups) twice, all at once as a
        # colocated step generates them (its per-request cost is fitted on these, not on the split replica's)
        ccfg = mode_config("colocated", args)
        batch = sample_budget(ccfg).max_concurrent_samples
        cal["rollout_only_shared"] = [rollout_only(ccfg, *asyncio.run(measure_rollout(replicas["shared"], ccfg, rows, batch)))
                                      for _ in range(2)]
    train = ray.remote(num_cpus=0, max_calls=1)(measure_train)  # a fresh worker per placement
    for kind, mode in (("split", "d"), ("shared", "colocated")):  # each with its trainer's OpenMP settings
        t = ray.get(train.options(**trainer_env(mode_config(mode, args))).remote(mode_config(mode, args), outputs))
        cal[f"train_s_per_token_{kind}"], cal[f"train_s_per_priced_token_{kind}"] = t["s_per_token"], t["s_per_priced_token"]
        cal[f"train_s_per_trained_priced_token_{kind}"] = t["s_per_trained_priced_token"]
        cal[f"train_rows_frac_{kind}"] = t["trained_rows_frac"]
        # whether these prices include the prefix grouper's plans (saved since session 39; before: measured without);
        # the shared placement's own flag only where it differs (grouper_measured)
        if kind == "split" or t["use_prefix_grouper"] != cal["use_prefix_grouper"]:
            cal["use_prefix_grouper" + ("" if kind == "split" else "_shared")] = t["use_prefix_grouper"]
    if "split" in replicas:  # contention: each side measured again with the other one busy
        load = train.remote(cfg, outputs, 45.0)  # the trainer busy on its core ...
        time.sleep(12.0)  # ... once its process has started and built its engine
        cal["decode_split_loaded"] = asyncio.run(probe_decode(split, prompt, **probe))
        ray.get(load)
        busy = train.remote(cfg, outputs)  # train-only again, while the replica generates
        while not ray.wait([busy], timeout=0)[0]:
            asyncio.run(measure_rollout(split, cfg, rows, 16))
        cal["train_s_per_token_split_loaded"] = ray.get(busy)["s_per_token"]
        cal["rollout_contention"] = contention(cal["decode_split"], cal["decode_split_loaded"])
        cal["train_contention"] = contention(cal["train_s_per_token_split"], cal["train_s_per_token_split_loaded"])
        print(f"  contention: decode {cal['rollout_contention']:+.0%} with the trainer busy ("
              + ", ".join(f"B={b}: {t * 1e3:.1f} ms" for b, t in cal["decode_split_loaded"].items())
              + f"), train {cal['train_contention']:+.0%} with the replica generating", flush=True)
    syncs = [r["sync/transfer_total_s"] for m in result["modes"].values() for r in m["history"] if "sync/transfer_total_s" in r]
    cal["sync_s"] = statistics.median(syncs) if syncs else 0.05
    return cal


PROBE_TOKENS = 48
"""Tokens per request of the decode probes (``calibrate``)."""
PROBE_BATCHES = (1, 8, 32, 128, 256)
"""Sequences per decode probe (``calibrate``). 256 since session 31: the engines seat 256, and a run with many groups in
flight decodes ~240 at once (d_s1_t2 on hf, session 30: 232 per iteration) where a table ending at 128 extrapolated
10.9 ms per iteration against 15.5 ms probed (the hf engine, one core)."""


def probe_prompt(cfg: Any) -> tuple[Any, list[dict], list[int]]:
    """``(tokenizer, rows, prompt_ids)`` of the calibration: the task's train rows (seed + 7) and the first one's
    rendered prompt, the decode probes' prompt (``calibrate``; ``check_args`` measures its length)."""
    from asyncrl.agent_loop.single_turn import render_prompt_ids
    from asyncrl.data.dataset import get_task_rows
    from asyncrl.models import load_tokenizer

    tok = load_tokenizer(cfg.actor_rollout_ref.model.tokenizer_path or cfg.actor_rollout_ref.model.path)
    rows = get_task_rows(cfg.data.task, "train", 512, cfg.trainer.seed + 7)
    return tok, rows, render_prompt_ids(tok, rows[0]["prompt"])


def calibration_context(args: argparse.Namespace) -> int:
    """The context (tokens) of the engines ``calibrate`` probes: the smaller ``resolved_max_model_len`` of the configs
    ``start_replicas`` builds them from (mode d's for ``split``, colocated's for ``shared``)."""
    from asyncrl.config_ranges import resolved_max_model_len

    return min(resolved_max_model_len(mode_config(m, args)) for m in ("d", "colocated"))


def long_probe_plan(context: int, short: int) -> tuple[Optional[int], Optional[str]]:
    """:func:`asyncrl.sim.probes.long_probe_plan` at the calibration's :data:`PROBE_TOKENS`; its ValueError (the decode
    probe cannot run) names ``--no-simulate`` as the other way out."""
    from asyncrl.sim.probes import long_probe_plan as plan

    try:
        return plan(context, short, PROBE_TOKENS)
    except ValueError as exc:
        raise ValueError(f"{exc}, or add --no-simulate") from None


def grouper_measured(cal: dict, kind: str) -> bool:
    """Whether the train prices of ``kind`` (``split`` / ``shared``) in a saved calibration were measured with the
    prefix grouper (``measure_train``'s ``use_prefix_grouper``, saved since session 39): the simulator then prices the
    grouper's plans, and only then. Results saved before were measured without it."""
    return bool(cal.get(f"use_prefix_grouper_{kind}", cal.get("use_prefix_grouper", False)))


def cpu_calibration(result: dict, args: argparse.Namespace) -> dict:
    """What the CPU simulation is priced from, out of a result's micro-measurements (never its runs).

    * response lengths: the calibration's rollout-only plus the ideal bound's (both the replica alone; 64 +
      96 groups). A long tail makes 64 groups' mean noisy: 22.7 and 26.5 tokens in two runs whose modes
      trained on 27-35, and a short pool runs the simulated rollout fast. Results saved before session 10
      kept the ideal's total tokens only: the pool is rescaled to the mean of both;
    * per-request cost (``fit_per_request``): the calibration's timed rollout-only (saved since session 10)
      and the ideal bound's (both the split replica alone at mode d's concurrency, 64 + 96 groups) fitted
      together (session 16: the calibration's 64 groups took 23% longer per group than the ideal bound's 96 in the
      same run); without
      the ideal's groups (saved before session 10), the ideal bound's alone, its lengths approximated by the
      pool's groups cycled and rescaled to its total. The shared (colocated) engine's own cost is fitted on its
      own rollout-only (``rollout_only_shared``, saved since session 17: one whole batch twice, every group at once
      as a colocated step starts them, the engine's two threads on both cores; without the agent loops, as every
      rollout-only); results saved before use the split replica's;
    * train price per *priced* token (``measure_train``'s ``s_per_priced_token``), else ``s_per_token``
      times real / priced tokens of the pool's mini-batches (``priced_tokens``); and per priced token of the rows
      it trained (``s_per_trained_priced_token``, saved since session 15), for a mode simulated with its own
      share of rows with a gradient (``simulate_modes``).

    Returns:
        ``{"pool", "per_request_s" (the split replica's), "per_request_by_kind": {kind: s}, "train": {kind: s per priced token}, "train_trained": {kind: s per priced
        token of trained rows}, "notes": [...]}``.
    """
    from asyncrl.sim.calibrate import fit_per_request, per_request_cap, priced_tokens
    from asyncrl.sim.probes import fit_token_costs
    from asyncrl.staleness import sample_budget

    cal, ideal, notes = result["calibration"], result.get("ideal") or {}, []
    if grouper_measured(cal, "split") or grouper_measured(cal, "shared"):
        notes.append("train prices measured with the prefix grouper: the simulated updates price its plans")
    # prefill and context prices of each engine (saved since session 34; before: 0, the probe's table alone)
    tokens = {kind: fit_token_costs(cal[f"token_costs_{kind}"], cal[f"decode_{kind}"], PROBE_TOKENS)
              for kind in ("split", "shared") if f"token_costs_{kind}" in cal and f"decode_{kind}" in cal}
    for kind, costs in tokens.items():
        notes += [f"{kind}: {n}" for n in costs.notes]
    plan = cal.get("token_probe_note")  # the long prompt capped, or the probes skipped (long_probe_plan)
    if not tokens:
        notes.append((plan or "no prefill / context probes (saved before session 34)")
                     + ": a resumed request's prefill and a long context's reads are priced at 0")
    elif plan:
        notes.append(plan)
    cfg = mode_config("d", args)
    n = cfg.actor_rollout_ref.rollout.n
    pt = int(cal["prompt_tokens"])
    pool = [int(x) for x in cal["response_lengths"]]
    if ideal.get("groups"):
        pool += [int(x) for g in ideal["groups"] for x in g]
    elif ideal.get("rollout_tokens"):
        k = (sum(pool) + ideal["rollout_tokens"]) / (len(pool) + ideal["rollout_s"] / ideal["rollout_s_per_sample"] * n) / (sum(pool) / len(pool))
        pool = [max(1, round(x * k)) for x in pool]
        notes.append(f"lengths: calibration pool x{k:.3f} to the mean of it and the ideal bound's rollout-only")
    ro = cal.get("rollout_only")
    more: list[dict] = []
    if ro:
        groups, seconds, conc = ro["groups"], ro["seconds"], ro["concurrency"]
        if ideal.get("rollout_s") and ideal.get("groups"):  # the same replica alone twice: fitted together
            more = [{"groups": ideal["groups"], "concurrency": conc, "seconds": ideal["rollout_s"]}]
            rate, ideal_rate = len(groups) / seconds, len(ideal["groups"]) / ideal["rollout_s"]
            if max(rate, ideal_rate) > 1.3 * min(rate, ideal_rate):
                notes.append(f"WARNING the calibration's rollout-only ran {rate:.2f} groups/s, the ideal bound's "
                             f"{ideal_rate:.2f}: the box was not quiet during one of them, and the prediction is only "
                             "as good as the calibration (session 11: another job during calibration, -44..-81%)")
    elif ideal.get("rollout_s"):
        own = [cal["response_lengths"][i:i + n] for i in range(0, len(cal["response_lengths"]), n)]
        count = round(ideal["rollout_s"] / ideal["rollout_s_per_sample"])
        groups = [own[i % len(own)] for i in range(count)]
        k = ideal["rollout_tokens"] / sum(map(sum, groups))
        groups = [[max(1, round(x * k)) for x in g] for g in groups]
        seconds, conc = ideal["rollout_s"], sample_budget(cfg).max_concurrent_samples
        notes.append(f"per-request cost fitted on the ideal bound's rollout-only, its lengths approximated "
                     f"(the calibration's groups cycled to {count}, x{k:.3f})")
    else:
        groups = None
    c, at_cap = None, False
    if groups and "decode_split" in cal:
        split = {int(b): t for b, t in cal["decode_split"].items()}
        c = fit_per_request(split, PROBE_TOKENS, groups, conc, seconds, pt, more=more,
                            token_costs=tokens.get("split")).prefill_s
        at_cap = c >= 0.999 * per_request_cap(split, PROBE_TOKENS, tokens.get("split"))
        if at_cap:  # the bisection ran into its bound
            notes.append(f"per-request cost at its cap ({c * 1e3:.2f} ms): even so the simulated rollout-only is faster "
                         f"than the measured {seconds:.2f} s; what slows the real one is not in the probe")
    by_kind = {"split": c, "shared": c}
    own = cal.get("rollout_only_shared")
    if own and "decode_shared" in cal:  # the colocated engine on its own rollout-only (saved since session 17)
        shared = {int(b): t for b, t in cal["decode_shared"].items()}
        first = own[0]
        by_kind["shared"] = fit_per_request(shared, PROBE_TOKENS, first["groups"], first["concurrency"], first["seconds"],
                                            pt, more=own[1:], token_costs=tokens.get("shared")).prefill_s
    elif c is not None and "decode_shared" in cal:  # before: the split replica's cost, capped at the shared probe's
        cap = per_request_cap({int(b): t for b, t in cal["decode_shared"].items()}, PROBE_TOKENS)
        if c > cap:
            notes.append(f"per-request cost on the shared probe capped at {cap * 1e3:.2f} ms (its own time per request)")
    for kind in [k for k in tokens if by_kind[k] is None]:  # no rollout-only: the probe's least-squares line, which
        del tokens[kind]  # prices the probe's own prefill and context already (cpu_cost_model refuses both)
        notes.append(f"{kind}: prefill / context prices unused, with no rollout-only to fit the per-request cost on")
    budget = cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu if cfg.actor_rollout_ref.actor.use_dynamic_bsz else None
    train = {}
    for kind in ("split", "shared"):
        if f"train_s_per_priced_token_{kind}" in cal:
            train[kind] = cal[f"train_s_per_priced_token_{kind}"]
            continue
        rows = [pt + x for x in cal["response_lengths"]]  # measure_train's mini-batches: per_mb groups in order
        per_mb = n * max(1, sample_budget(cfg).required_samples // cfg.async_training.require_batches)
        gids = [i // n for i in range(len(rows))]  # rollout.n responses per group, in order
        priced = sum(priced_tokens(rows[i:i + per_mb], budget, gids[i:i + per_mb], [pt] * len(rows[i:i + per_mb]),
                                   grouper_measured(cal, kind), cfg.actor_rollout_ref.actor.ppo_micro_batch_size)
                     for i in range(0, len(rows), per_mb))
        train[kind] = cal[f"train_s_per_token_{kind}"] * sum(rows) / priced
        if kind == "split":
            notes.append(f"train price per priced token: s_per_token x {sum(rows) / priced:.3f} (real / priced tokens)")
    trained = {kind: cal[f"train_s_per_trained_priced_token_{kind}"] for kind in ("split", "shared")
               if f"train_s_per_trained_priced_token_{kind}" in cal}
    return {"pool": pool, "per_request_s": c, "per_request_at_cap": at_cap, "per_request_by_kind": by_kind,
            "train": train, "train_trained": trained, "token_costs": tokens, "notes": notes}


def sim_bound(cost: Any, cfg: Any, lengths: Any, prompt_tokens: int, groups: int = 96,
              gradient_fraction: Any = None) -> dict:
    """The simulator's own bound for ``cfg``: its rollout-only (``simulate_rollout_only``: ``groups`` groups of
    the lengths it simulates, at ``cfg``'s concurrency budget, the replica alone) and its train-only (the
    cost model's updates over those groups; with ``gradient_fraction``, over the rows drawn to have a gradient,
    as the simulated trainer draws them) -> ``1 / max`` (async) or ``1 / sum`` (colocated). A simulated
    run above it is an error of the simulator unless it says why."""
    from asyncrl.sim.calibrate import simulate_rollout_only
    from asyncrl.staleness import sample_budget

    n, b = cfg.actor_rollout_ref.rollout.n, sample_budget(cfg)
    gl = [[int(lengths(f"bound-{i}-{k}", (i,))) for k in range(n)] for i in range(groups)]  # one prompt per group
    ro = simulate_rollout_only(dataclasses.replace(cost.rollout, contention=0.0), gl, b.max_concurrent_samples,
                               prompt_tokens) / groups
    actor = cfg.actor_rollout_ref.actor
    train = dataclasses.replace(cost.train, contention=0.0,
                                max_token_len=actor.ppo_max_token_len_per_gpu if actor.use_dynamic_bsz else None)
    per_mb = max(1, b.required_samples // cfg.async_training.require_batches)
    rng = random.Random(0)

    if train.shared_prefix is None:  # as the simulation of cfg prices it (asyncrl.sim.runner)
        from asyncrl.trainer.shared_prefix import uses_prefix_grouper

        train = dataclasses.replace(train, shared_prefix=uses_prefix_grouper(cfg))
    train = dataclasses.replace(train, micro_batch_rows=actor.ppo_micro_batch_size)

    def trained(rows: list) -> tuple[list, list, list]:  # (lengths, group ids, prompts) of the rows kept
        keep = [j for j, (_, x) in enumerate(rows) if gradient_fraction is None or rng.random() < gradient_fraction(x)]
        keep = keep or [0]
        return [prompt_tokens + rows[j][1] for j in keep], [rows[j][0] for j in keep], [prompt_tokens] * len(keep)

    tr = sum(train.update_time(*trained([(k, x) for k in range(i, min(groups, i + per_mb)) for x in gl[k]]))
             for i in range(0, groups, per_mb)) / groups
    both = ro + tr if cfg.actor_rollout_ref.hybrid_engine else max(ro, tr)
    return {"rollout_s_per_sample": ro, "train_s_per_sample": tr, "samples_per_s": 1.0 / both}


def simulate_modes(result: dict, args: argparse.Namespace) -> dict:
    """The simulator's prediction of every measured mode from the calibration alone (``--gpu``: from the
    documented H200 cost model, ``gpu_sim.py``)."""
    if args.gpu:
        import gpu_sim

        result["simulated_from"] = gpu_sim.SIMULATED_FROM
        return gpu_sim.simulate_measured(result, args, mode_config)
    from asyncrl.sim import simulate
    from asyncrl.sim.calibrate import cpu_cost_model
    from asyncrl.sim.workload import empirical_lengths, gradient_fraction, group_correlation
    from asyncrl.staleness import sample_budget

    cal = result["calibration"]
    inputs = cpu_calibration(result, args)
    # how much a group's responses share their length, from the rollout-only's groups (the replica alone, the same
    # sampling): the runs' own lengths are kept per response only (summary.response_length_counts)
    rho = (group_correlation((cal.get("rollout_only") or {}).get("groups") or [])
           if getattr(args, "group_correlation", True) else 0.0)
    inputs["group_correlation"] = rho
    print(f"  calibration: the lengths of a group's responses correlate at {rho:.2f} (rollout-only groups)", flush=True)
    pool_lengths = empirical_lengths(inputs["pool"], rho)
    result["sim_calibration"] = {k: v for k, v in inputs.items() if k not in ("pool", "token_costs")}
    result["sim_calibration"]["token_costs"] = {k: dataclasses.asdict(v) for k, v in inputs["token_costs"].items()}
    out = {}
    for note in inputs["notes"]:
        print(f"  calibration: {note}", flush=True)
    if inputs["per_request_s"] is not None:
        how = "at its cap, see above" if inputs.get("per_request_at_cap") else "the rollout-only reproduced"
        print(f"  calibration: per-request cost {inputs['per_request_s'] * 1e3:.2f} ms ({how})", flush=True)
    if cal.get("rollout_only_shared"):
        print(f"  calibration: per-request cost of the shared engine {inputs['per_request_by_kind']['shared'] * 1e3:.2f} ms "
              f"(its own rollout-only, {len(cal['rollout_only_shared'])} batches of "
              f"{len(cal['rollout_only_shared'][0]['groups'])} groups: "
              + ", ".join(f"{r['seconds']:.2f} s" for r in cal["rollout_only_shared"]) + ")", flush=True)
    for m, measured in result["modes"].items():
        # priced by placement of the work, not of the engine: every async mode (d_unpinned too, whose two busy
        # processes share the two cores as the pinned pair does) on the split probes and their contention terms
        kind = "shared" if m.startswith("colocated") else "split"
        if f"decode_{kind}" not in cal:
            continue
        # the workload: the lengths this mode trained (the policy's, which drift as it learns), else (results saved
        # before session 14) the pool of the calibration's rollout-only measurements; and (saved since session 15)
        # the share of them with a gradient, priced at the train price of trained rows
        own, own_grad = measured.get("response_length_counts"), measured.get("gradient_length_counts")
        # what the policy generated: the rows it trained and (saved since session 21) those the trainer dropped as
        # stale, the long tail (session 24's d_s1: 216 rows of mean 95 tokens beside 4,096 trained of mean 24); the
        # simulated trainer drops its own stale groups from these
        generated = dict(collections.Counter({int(k): int(v) for k, v in (own or {}).items()})
                         + collections.Counter({int(k): int(v) for k, v in (measured.get("stale_length_counts") or {}).items()}))
        lengths = empirical_lengths(generated, rho) if own else pool_lengths
        fraction = (gradient_fraction(own, own_grad) if own and own_grad and kind in inputs["train_trained"]
                    else None)
        price = inputs["train_trained"][kind] if fraction else inputs["train"][kind]
        cost = cpu_cost_model({int(k): v for k, v in cal[f"decode_{kind}"].items()}, price,
                              cal["sync_s"], int(cal["prompt_tokens"]),
                              rollout_contention=cal.get("rollout_contention", 0.0) if kind == "split" else 0.0,
                              train_contention=cal.get("train_contention", 0.0) if kind == "split" else 0.0,
                              per_request_s=inputs["per_request_by_kind"][kind], probe_tokens=PROBE_TOKENS,
                              token_costs=inputs["token_costs"].get(kind), shared_prefix=grouper_measured(cal, kind))
        cfg = mode_config(m, args)
        cfg.trainer.total_training_steps = measured["steps"]
        cfg.trainer.total_time_s = 0.0
        res = simulate(cfg, cost, natural_length=lengths, name=m, gradient_fraction=fraction)
        bare = None
        if kind == "split":  # the same prediction without the contention term, to show what it adds
            bare = simulate(cfg, dataclasses.replace(cost, rollout=dataclasses.replace(cost.rollout, contention=0.0),
                                                     train=dataclasses.replace(cost.train, contention=0.0)),
                            natural_length=lengths, name=m, gradient_fraction=fraction).samples_per_s
        bound = sim_bound(cost, cfg, lengths, int(cal["prompt_tokens"]), gradient_fraction=fraction)
        above = None
        if res.samples_per_s > 1.02 * bound["samples_per_s"]:
            above = (f"simulated {res.samples_per_s:.3f} above its own bound {bound['samples_per_s']:.3f}: "
                     f"the run's lengths are drawn per request id, the bound's from 96 groups of the same pool")
            print(f"  WARNING {m}: {above}", flush=True)
        out[m] = {"samples_per_s": res.samples_per_s, "without_contention_samples_per_s": bare,
                  "trainer_idle_ratio": res.trainer_idle_ratio,
                  "rollouter_idle_ratio": res.rollouter_idle_ratio, "step_s": res.step_time(2),
                  "bound": bound, "above_bound": above,
                  "gradient_rows_frac": fraction.overall if fraction else None,  # given; and what its updates drew:
                  "trained_rows_frac": statistics.mean(r.get("actor/trained_rows_frac", 1.0) for r in res.history),
                  "step_split": step_split(res.history[pipeline_fill(res.history):]),
                  "train_price": price * (1.0 + cost.train.contention),  # s per priced token, as charged
                  # the simulated engines' rollout/engine_* beside the measured ones (print_split_beside)
                  "engine": {**engine_summary(res.history[pipeline_fill(res.history):]),
                             **generation_cost(res.history, sample_budget(cfg).required_samples
                                               * cfg.actor_rollout_ref.rollout.n, res.accounting.get("dropped", {}))},
                  "error": res.samples_per_s / measured["samples_per_s"] - 1 if measured["samples_per_s"] else None}
    return out


def run_reference(path: str, seconds: float) -> dict:
    """The single-process synchronous GRPO reference loop (rlproto) for ``seconds``; its s/step."""
    work = tempfile.mkdtemp(prefix="rlproto_")
    path = os.path.abspath(path)  # the loop runs in its own working directory
    env = {**os.environ, "PYTHONPATH": path}
    py = sys.executable
    subprocess.run([py, os.path.join(path, "sft.py"), "--target", "0.35", "--eval_every", "50"], cwd=work, env=env,
                   check=True, capture_output=True)
    subprocess.run([py, os.path.join(path, "grpo_best.py"), "--max_time", str(seconds), "--lr", "3e-4", "--warmup", "30",
                    "--decay", "--prompts", "32", "--seed", "1", "--eval_every", "1000000"], cwd=work, env=env,
                   check=True, capture_output=True)
    rows = [json.loads(x) for x in open(os.path.join(work, "grpo_log.jsonl")) if x.strip()]
    steps = [r for r in rows if "gen_s" in r]
    times = [r["time"] for r in steps]
    per_step = [b - a for a, b in zip(times, times[1:])]
    return {"steps": len(steps), "step_s_median": statistics.median(per_step) if per_step else None,
            "gen_s_median": statistics.median(r["gen_s"] for r in steps),
            "train_s_median": statistics.median(r["train_s"] for r in steps)}


def host_info() -> dict:
    """The machine a result was measured on: CPU model and count, torch, and the GPUs (names, driver's CUDA).
    Host-bound steps (the FSDP2 update, session 9) move with the host: two H200 runs of the same batches, sessions
    10 and 13, differ by 11-20% in the update with no code change in its path."""
    import platform

    import torch

    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {"cpu": model, "cpus": os.cpu_count(), "torch": torch.__version__, "cuda": torch.version.cuda, "gpus": gpus}


ENGINE_START_KEYS = ("actor_rollout_ref.rollout.max_num_seqs", "actor_rollout_ref.rollout.scheduling_policy")
"""Mode keys an engine takes at its start: a mode that sets one runs on a replica of its own."""


def replica_kind(mode: str, args: argparse.Namespace) -> str:
    """The shared replica a mode runs on (``shared`` | ``split``, then ``+key=value`` for each of
    :data:`ENGINE_START_KEYS` the mode sets), or ``""``: colocated with the hf backend on CPU builds its engine in
    the trainer process (verl's hybrid engine), so it is given none."""
    if mode.startswith("colocated") and mode != "colocated_replica" and args.backend == "hf" and not args.gpu:
        return ""
    base = "shared" if mode.startswith("colocated") or mode in UNPINNED else "split"
    return base + "".join(f"+{k.rsplit('.', 1)[1]}={v}" for k, v in MODES.get(mode, {}).items() if k in ENGINE_START_KEYS)


def start_replicas(args: argparse.Namespace, modes: list[str]) -> dict[str, Any]:
    """One engine per placement: ``split`` (rollout cores only) for the async modes, ``shared`` for colocated."""
    from asyncrl.rollout.replica import RolloutReplica

    need = {replica_kind(m, args) for m in modes if replica_kind(m, args)}
    need |= {"split"} if args.ideal else set()
    if args.simulate and not args.gpu:
        need |= {"shared", "split"}
    reps = {}
    for kind in sorted(need):
        cfg = mode_config("colocated" if kind.startswith("shared") else "d", args)
        for item in kind.split("+")[1:]:  # the engine-start keys of the modes on it (ENGINE_START_KEYS)
            name, value = item.split("=", 1)
            setattr(cfg.actor_rollout_ref.rollout, name, type(getattr(cfg.actor_rollout_ref.rollout, name))(value))
        server_id = "replica_" + "".join(c if c.isalnum() else "_" for c in kind)
        reps[kind] = RolloutReplica(cfg, server_id=server_id, replica_rank=0)
    for r in reps.values():
        r.wait_ready(timeout=1200)
    return reps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--task", default="longtail", choices=["longtail", "arith"],
                   help="longtail: lognormal answer lengths (the async case); arith: the embedded demo's task")
    p.add_argument("--modes", default="colocated,a,b,c,d", help="comma-separated modes (the list above)")
    p.add_argument("--steps", type=int, default=30, help="trainer steps per mode")
    p.add_argument("--time", type=float, default=0.0, help="training seconds per mode (0 = only --steps)")
    p.add_argument("--backend", default="vllm", choices=["vllm", "hf"], help="rollout engine (hf: transformers)")
    p.add_argument("--target-reward", type=float, default=0.5,
                   help="'to target' column: wall seconds until the mean reward first reaches this (a short run may "
                        "not reach it: 'not reached' is no error)")
    p.add_argument("--ideal", action=argparse.BooleanOptionalAction, default=True, help="measure the ideal bound")
    p.add_argument("--ideal-groups", type=int, default=96, help="prompt groups of the rollout-only measurement")
    p.add_argument("--repeats", type=int, default=1,
                   help="run the modes this many rounds (rounds 2, 4, ... in reverse order) and measure the ideal bound "
                        "after each: every ratio is printed per round with its median and range (one run's ratio on "
                        "a shared 2-core box moves by tens of percent); the main table shows each mode's median run")
    p.add_argument("--reference", default=None, help="rlproto directory: time the reference loop too")
    p.add_argument("--reference-seconds", type=float, default=60.0, help="--reference: seconds of the reference loop")
    p.add_argument("--simulate", action=argparse.BooleanOptionalAction, default=True,
                   help="calibrate the simulator on engine micro-measurements and predict every mode")
    p.add_argument("--gpu", action="store_true",
                   help="two GPUs: async = replica on GPU 0 + FSDP2 trainer on GPU 1, colocated = both on both; "
                        "a random Qwen2.5-0.5B-shaped model with synthetic lengths (needs no vllm with --backend hf)")
    p.add_argument("--gpus", type=int, default=2,
                   help="--gpu: GPUs of the run (colocated shares all; async modes give half to the rollout)")
    p.add_argument("--gpu-median-tokens", type=int, default=256, help="--gpu: median synthetic response length")
    p.add_argument("--gpu-max-tokens", type=int, default=4096, help="--gpu: longest synthetic response")
    p.add_argument("--simulate-only", action="store_true",
                   help="--gpu: no GPU, no Ray: predict colocated (1 and --gpus GPUs) and the async --modes "
                        "(--gpus GPUs) with the H200 cost model, and their ratios (gpu_sim.py)")
    p.add_argument("--calibration", default=None,
                   help="with --simulate-only (CPU): a saved --json result; re-simulate its measured modes from its "
                        "calibration with today's simulator, no Ray (printed beside the saved prediction)")
    p.add_argument("--group-correlation", action=argparse.BooleanOptionalAction, default=True,
                   help="simulate a group's responses with the length correlation measured on the rollout-only's "
                        "groups (asyncrl.sim.workload.group_correlation); --no-group-correlation: each response "
                        "drawn on its own (the simulator before it correlated a group)")
    p.add_argument("--census", action="store_true",
                   help="sample every process's CPU time, cores and threads during each mode (cpu_census.py)")
    p.add_argument("--set", nargs="*", help="extra config overrides for every mode (key=value)")
    p.add_argument("--actor-logs", action="store_true",
                   help="stream the actors' output (vLLM and Ray start-up warnings) to this console; by default it "
                        "stays in Ray's session logs, so the console shows the benchmark's own lines")
    p.add_argument("--out", default=str(REPO / "runs" / "bench_async_vs_colocate"),
                   help="directory of the runs' checkpoints, logs and metrics (one folder per mode)")
    p.add_argument("--json", default=None, help="write the whole result (modes, calibration, simulation) to this file")
    p.add_argument("--dry-run", action="store_true",
                   help="make the checks a run makes first, print each mode's keys and placement and what else the "
                        "run measures, and start nothing (no Ray, no engine, no --gpu model)")
    args = p.parse_args()
    modes = check_args(p, args)
    if args.dry_run:
        dry_run(args, modes)
        return
    if args.simulate_only and args.calibration:  # CPU: the modes of a saved result, re-simulated, no Ray
        resimulate(args)
        return
    if args.simulate_only:
        import gpu_sim

        predicted = gpu_sim.simulate_only(args, modes, mode_config)
        if args.json:
            Path(args.json).write_text(json.dumps({"argv": sys.argv[1:], "predicted": predicted}, indent=1))
        return
    import ray

    from asyncrl.ray_start import init_ray

    init_ray(None, None, attempts=5, log_to_driver=args.actor_logs)
    if not args.actor_logs:
        print("actors' output (vLLM, Ray workers): Ray's session logs, /tmp/ray/session_latest/logs by default "
              "(--actor-logs prints it here)", flush=True)
    if args.census:
        global CENSUS
        from cpu_census import CpuCensus

        CENSUS = CpuCensus().start()
    result: dict[str, Any] = {"task": args.task, "backend": args.backend, "gpu": args.gpu, "cores": len(os.sched_getaffinity(0)),
                              "argv": sys.argv[1:], "modes": {}, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                              "host": host_info()}
    if args.gpu:  # replicas are placed on GPUs by each Experiment; the CPU-core measurements do not apply
        import gpu_sim

        result["trainer_layout"] = gpu_sim.TRAINER_LAYOUT  # which FSDP2 engine ran it (gpu_sim.simulate_measured)
        result["rollout_slots"] = gpu_sim.ROLLOUT_SLOTS  # and which hf engine
        args.ideal = False  # and the simulator predicts from the H200 cost model instead (simulate_modes)
    replicas = {} if args.gpu else start_replicas(args, modes)
    try:
        print(f"{args.task} ({args.backend}), {args.steps} steps per mode:", flush=True)
        for r, order in enumerate(round_orders(modes, args.repeats)):
            if args.repeats > 1:
                print(f"round {r + 1} of {args.repeats}: {', '.join(order)}", flush=True)
                result.setdefault("rounds", []).append({"order": order, "modes": {}})
            for m in order:
                run = run_mode(m, replicas.get(replica_kind(m, args) or ""), args)
                if args.repeats > 1:
                    result["rounds"][-1]["modes"][m] = run
                else:
                    result["modes"][m] = run
                save(result, args)  # a later phase that fails loses nothing measured
            if args.ideal and "split" in replicas:
                ideal = ideal_bound(replicas["split"], args, modes)
                if args.repeats > 1:
                    result["rounds"][-1]["ideal"] = ideal
                else:
                    result["ideal"] = ideal
                save(result, args)
        if args.repeats > 1:
            result.update(combine_rounds(result["rounds"], modes))
            save(result, args)
        if args.simulate and not args.gpu:
            result["calibration"] = calibrate(replicas, result, args)
            save(result, args)
    finally:
        for r in replicas.values():
            r.shutdown()
        ray.shutdown()
    if args.reference:
        result["reference"] = run_reference(args.reference, args.reference_seconds)
    if args.simulate and ("calibration" in result or args.gpu):
        result["simulated"] = simulate_modes(result, args)
    if priced_bounds(result):
        result["priced"] = priced_bounds(result)
    save(result, args)
    report(result)


def print_split_beside(sim: dict, measured: dict) -> None:
    """Where a simulated mode's error comes from: its median step split beside the measured one, and the share of
    trained rows with a gradient it was given (``simulate_modes``); with that share, the train price per token
    through the model measured in the run (``perf/update_s_per_token``) beside the one the simulation charged."""
    ms, ss = measured.get("step_split") or {}, sim.get("step_split") or {}
    parts = [f"{k} {ms[k]:.2f} / {ss[k]:.2f}" for k in ("gen", "fetch", "update", "sync", "step") if k in ms and k in ss]
    grad = sim.get("gradient_rows_frac")
    if parts:
        print(f"{'':10s} per step (median s, measured / simulated): " + ", ".join(parts)
              + (f"; rows with a gradient {grad:.2f}" if grad is not None else ""))
    me, se = measured.get("engine") or {}, sim.get("engine") or {}
    both = [k for k in ("batch_mean", "tokens_per_s", "tokens_per_trained_token") if k in me and k in se]
    if both:  # the engine statistics both report the same way (decode ms and busy ratio do not: the simulator's
        # iteration price folds in vLLM's scheduling and output handling, which the engine's own timing leaves out)
        names = {"batch_mean": "batch", "tokens_per_s": "tokens/s", "tokens_per_trained_token": "tokens per token trained"}
        stale = [f"{d.get('dropped_stale', 0):.0f} + {d.get('dropped_stale_in_generation', 0):.0f}" for d in (me, se)]
        print(f"{'':10s} engine (measured / simulated): " + ", ".join(
            f"{names[k]} {me[k]:,.{0 if k == 'tokens_per_s' else 2}f} / {se[k]:,.{0 if k == 'tokens_per_s' else 2}f}"
            for k in both) + (f"; groups dropped stale {stale[0]} / {stale[1]}" if "dropped_stale" in me else ""))
    run_price, sim_price = measured.get("train_price"), sim.get("train_price")
    if run_price and sim_price and sim.get("gradient_rows_frac") is not None:  # both per token of the trained rows
        print(f"{'':10s} train price (us per token through the model, measured in the run / simulated): "
              f"{run_price * 1e6:.1f} / {sim_price * 1e6:.1f} ({run_price / sim_price:.2f}x)")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """``--help``: the module docstring as written, and every option's default."""


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """Every argument mistake ends here, in one ``error:`` / ``config error:`` line and exit status 2, before Ray,
    an engine or the ``--gpu`` model (494M parameters, ~1 GB written) starts; returns the modes asked for.
    Each mode's config is built (and validated) as the run will build it."""
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes:
        p.error(f"--modes {args.modes!r} names no mode (modes: {', '.join(MODES)})")
    if len(set(modes)) < len(modes):
        p.error(f"--modes {args.modes!r} names a mode twice (use --repeats N to run each mode N times)")
    for m in modes:
        if m not in MODES:
            import difflib

            near = [k for k in MODES if k.lower() == m.lower()] or difflib.get_close_matches(m.lower(), MODES, n=1)
            p.error(f"unknown mode {m!r}" + (f"; did you mean {near[0]!r}?" if near else "")
                    + f" (modes: {', '.join(MODES)}; see --help)")
    for name in ("steps", "repeats", "ideal_groups"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not (args.time >= 0 and math.isfinite(args.time)):  # NaN and inf too
        p.error(f"--time must be 0 (only --steps) or a number of training seconds per mode, got {args.time}")
    if args.calibration and not args.simulate_only:
        p.error("--calibration F re-simulates a saved result without running it: add --simulate-only")
    if args.simulate_only and not (args.gpu or args.calibration):
        p.error("--simulate-only predicts the --gpu rows, or with --calibration F re-simulates a saved CPU result")
    if args.simulate_only and args.gpu and args.calibration:
        p.error("--calibration re-simulates a saved CPU result; a --gpu prediction needs none: drop one of them")
    if args.calibration:
        try:
            saved = json.loads(Path(args.calibration).read_text())
        except (OSError, ValueError) as exc:
            p.error(f"--calibration {args.calibration}: cannot read a saved result ({type(exc).__name__}: {exc})")
        if not isinstance(saved, dict) or saved.get("gpu") or not isinstance(saved.get("calibration"), dict) \
                or not isinstance(saved.get("modes"), dict):
            why = ("a --gpu result (re-simulate those with tests/test_sim_gpu.py's path, or predict with --gpu "
                   "--simulate-only)" if isinstance(saved, dict) and saved.get("gpu") else
                   "no calibration: it was made with --no-simulate, or is not a --json file of this benchmark")
            p.error(f"--calibration {args.calibration}: {why}")
    if args.gpu:
        cpu = [m for m in modes if cpu_only(m)]
        if cpu:
            p.error(f"--gpu: mode(s) {', '.join(cpu)} differ from another mode only in the CPU run's placement, threads "
                    "or vLLM-CPU outputs; on GPUs they run as that mode: drop them")
        if args.gpus < 1:
            p.error(f"--gpus must be at least 1, got {args.gpus}")
        asynchronous = [m for m in modes if not m.startswith("colocated")]
        if args.gpus < 2 and asynchronous:
            p.error(f"--gpus {args.gpus}: mode(s) {', '.join(asynchronous)} split the GPUs between rollout and "
                    "trainer; they need --gpus 2 or more (only the colocated modes run on one GPU)")
        if args.gpu_max_tokens < 1 or args.gpu_median_tokens < 1:
            p.error(f"--gpu-median-tokens and --gpu-max-tokens must be at least 1, got {args.gpu_median_tokens} "
                    f"and {args.gpu_max_tokens}")
        if args.gpu_median_tokens > args.gpu_max_tokens:
            p.error(f"--gpu-median-tokens {args.gpu_median_tokens} is above --gpu-max-tokens {args.gpu_max_tokens}: "
                    "the median response must fit under the cap")
        if not args.simulate_only and args.backend != "hf" and any(m.startswith("colocated") for m in modes):
            p.error("--gpu: the colocated modes hand the weights over through cuda_ipc, which only the hf rollout "
                    "backend has (vLLM's CUDA build is not on the GPU machine either): add --backend hf")
    if args.reference and not all((Path(args.reference) / f).is_file() for f in ("sft.py", "grpo_best.py")):
        p.error(f"--reference {args.reference}: not the rlproto reference loop's directory (it holds sft.py and "
                "grpo_best.py, e.g. ../shared/baselines/rlproto)")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        p.error(f"--json {args.json}: its directory does not exist")
    from asyncrl.config import ConfigError

    # every mode's config as the run builds it, --set included. --simulate-only prices the hf engine's cost model whatever --backend says (gpu_sim.predict); and the
    # check builds no --gpu model (simulate_only: the embedded model's path stands in). --calibration:
    # resimulate() builds the saved run's modes on its task and backend, with this --set
    checked = argparse.Namespace(**{**vars(args), "simulate_only": True,
                                    "backend": "hf" if args.simulate_only else args.backend})
    to_check = modes
    if args.simulate_only and args.calibration:
        checked.task, checked.backend = saved.get("task", args.task), saved.get("backend", args.backend)
        to_check = [m for m in saved["modes"] if m in MODES]
    try:
        for m in to_check:
            mode_config(m, checked)
        conflicts = set_conflicts(checked, to_check)
        if conflicts:
            raise ConfigError(conflicts[0] + (f" ({len(conflicts) - 1} more like it)" if len(conflicts) > 1 else ""))
        if not args.simulate_only and not args.gpu:  # --gpu: the model is built after these checks (a stand-in here)
            preflight_modes(checked, modes)
        if getattr(args, "simulate", False) and not args.gpu and not args.simulate_only:
            check_calibration(checked)
    except Exception as exc:  # the user's (a config, a dataset, an unknown name) in one line, as asyncrl's CLI
        from asyncrl.cli import _user_error

        err = _user_error(exc)
        if err is None:
            raise
        print(f"{err.kind} error: {err}", file=sys.stderr)
        sys.exit(2)
    if args.gpu and not args.simulate_only:  # last: the checks above hold on any machine (tests run them on CPU)
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < args.gpus:
            p.error(f"--gpu --gpus {args.gpus}: this machine has {have} CUDA GPU(s)"
                    + (": add --simulate-only for the predicted GPU rows, or drop --gpu for the CPU run" if not have
                       else f": lower --gpus to {have} (async modes need 2)"))
    return modes


def dry_run(args: argparse.Namespace, modes: Sequence[str]) -> None:
    """``--dry-run`` (after :func:`check_args`, so every refusal a run makes first is made): per mode, the keys it
    sets over the task's recipe (the placement's, then its own; ``--set`` applies to all) and, on CPU, where its glue
    and vLLM's front end go (as ``asyncrl train --dry-run`` says it); then the run's other measurements. Starts no
    Ray, engine or ``--gpu`` model (the embedded model's path stands in for it)."""
    from asyncrl.cpu_affinity import frontend_placement_line, glue_placement_line
    from asyncrl.rollout.backends import get_backend_cls

    stand_in = argparse.Namespace(**{**vars(args), "simulate_only": True})  # mode_config builds no --gpu model
    if args.simulate_only and args.calibration:  # resimulate(): the saved run's modes, task and steps, not --modes
        saved = json.loads(Path(args.calibration).read_text())
        print(f"--dry-run: --simulate-only --calibration re-simulates {args.calibration}'s measured modes "
              f"({', '.join(saved.get('modes', {})) or 'none'}; task {saved.get('task', '?')}; --modes and --steps do "
              "not apply) from its calibration; nothing started")
        return
    if args.simulate_only:  # gpu_sim.simulate_only
        colocated = ["colocated"] + [m for m in modes if m.startswith("colocated") and m != "colocated"]
        print(f"--dry-run: --gpu --simulate-only predicts {', '.join(colocated)} on {' and '.join(map(str, sorted({1, args.gpus})))} "
              f"GPU(s) and {', '.join(m for m in modes if m not in colocated) or 'no async mode'} on {args.gpus}, with the "
              "H200 cost model, and each async mode's ratio to colocated; no GPU, no Ray; nothing started")
        return
    per_mode = f"{args.steps} steps" + (f" or {args.time:g} s" if args.time else "")
    task = (f"arith prompts with lognormal response lengths (median {args.gpu_median_tokens}, at most "
            f"{args.gpu_max_tokens} tokens) on a random Qwen2.5-0.5B-shaped model written under --out") if args.gpu else args.task
    print(f"--dry-run: task {task}, backend {args.backend}, {'GPUs ' + str(args.gpus) if args.gpu else 'CPU'}, "
          f"{len(modes)} mode(s) x {args.repeats} round(s), {per_mode} each"
          + (f"; --set {' '.join(args.set)} for every mode" if args.set else ""))
    for m in modes:
        cfg = mode_config(m, stand_in)
        print(f"{m}: " + (" ".join(placement(m, stand_in) + [f"{k}={v}" for k, v in MODES[m].items()]) or "(the recipe)"))
        if not args.gpu and not m.startswith("colocated"):
            backend_cls = get_backend_cls(cfg.actor_rollout_ref.rollout.name)
            print(f"    {glue_placement_line(cfg)}\n    {frontend_placement_line(cfg, backend_cls)}")
    then = [f"the ideal bound (rollout-only on {args.ideal_groups} groups, train-only) after each round"] \
        if args.ideal and not args.gpu else []  # main() turns it off on GPUs
    if args.simulate and args.gpu:  # gpu_sim.simulate_measured: its cost model is the hf engine's
        then.append("a prediction of every mode from the H200 cost model" if args.backend == "hf" else
                    "no prediction (the H200 cost model is of the hf engine; --backend hf for one)")
    elif args.simulate:
        then.append("the simulator's calibration (decode probes, train-only) and a prediction of every mode")
    if args.census:
        then.append("a census of every process's CPU time, cores and threads per mode, and what else ran on the "
                    "trainer's cores" + (" (the ideal bound priced with it)" if args.ideal else ""))
    if args.reference:
        then.append(f"the reference loop {args.reference} for {args.reference_seconds:g} s")
    print("then: " + ("; ".join(then) if then else "nothing else") + f"; results under {args.out}"
          + (f", JSON {args.json}" if args.json else ""))
    print("nothing started (--dry-run)")


def preflight_modes(args: argparse.Namespace, modes: Sequence[str]) -> None:
    """The checks a run makes before any process starts (:meth:`asyncrl.experiment.Experiment.preflight`, as
    ``asyncrl train --dry-run``: the data can fill a step within ``data.max_prompt_length``, prompt + response fit the
    model, the model and reward load), for each mode's config, before Ray: a mode refused there failed after Ray and
    its engines had started (~45 s). Configs that differ only in what these checks do not read are checked once.

    Raises:
        ConfigError (and the other errors ``preflight`` documents): the first mode refused.
    """
    from asyncrl.experiment import Experiment

    seen = set()
    for m in modes:
        cfg = mode_config(m, args)
        key = (repr(cfg.data), repr(cfg.actor_rollout_ref.model), repr(cfg.actor_rollout_ref.rollout),
               repr(cfg.custom_reward_function))
        if key not in seen:
            seen.add(key)
            Experiment(cfg).preflight()


def check_calibration(args: argparse.Namespace) -> None:
    """The calibration (after every timed mode) can run on the engines' context: refused here, before Ray, only when
    its decode probe cannot (no simulation at all); a long-prompt probe capped or skipped is printed now and again when
    it runs (``long_probe_plan``). The probe's prompt is tokenized only for a context under the default probes' needs.

    Raises:
        ConfigError: the context cannot hold the decode probe.
    """
    from asyncrl.config import ConfigError
    from asyncrl.sim.probes import LONG_PROMPT_TOKENS

    context = calibration_context(args)
    if context >= LONG_PROMPT_TOKENS + PROBE_TOKENS:
        return
    short = len(probe_prompt(mode_config("d", args))[2])
    try:
        _, note = long_probe_plan(context, short)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if note:
        print(f"calibration: {note}", flush=True)


def resimulate(args: argparse.Namespace) -> dict:
    """``--simulate-only --calibration F``: the measured modes of a saved CPU result predicted again from its
    calibration (the task and steps of the saved run; ``--json`` keeps the new prediction)."""
    result = json.loads(Path(args.calibration).read_text())
    if "calibration" not in result:
        raise SystemExit(f"{args.calibration}: no calibration (the run was made with --no-simulate)")
    saved = result.get("simulated") or {}
    args.task, args.backend = result.get("task", args.task), result.get("backend", args.backend)
    print(f"re-simulating {args.calibration} ({result.get('started', '?')}: {' '.join(result.get('argv', []))})", flush=True)
    result["simulated"] = simulate_modes(result, args)
    w = max([10, *map(len, result["simulated"])])  # the widest mode name (d_s1_t2_keep: 12) keeps the columns
    print(f"\n{'mode':{w}s} measured  saved sim (error)   now simulated (error)   its own bound")
    for m, r in result["simulated"].items():
        meas = result["modes"][m]["samples_per_s"]
        old = saved.get(m, {}).get("samples_per_s")
        was = f"{old:9.3f} ({100 * (old / meas - 1):+4.0f}%)" if old else "        -       "
        print(f"{m:{w}s} {meas:8.3f}  {was}   {r['samples_per_s']:9.3f} ({100 * r['error']:+4.0f}%)         "
              f"{r['bound']['samples_per_s']:.3f}" + (" ABOVE" if r.get("above_bound") else ""))
        print_split_beside(r, result["modes"][m])
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return result


def round_orders(modes: list[str], repeats: int) -> list[list[str]]:
    """The order of the modes in each of ``repeats`` rounds: as given, then reversed, alternately, so a drift of
    the machine's speed over the run weighs on every mode alike."""
    return [list(modes) if r % 2 == 0 else list(reversed(modes)) for r in range(max(1, repeats))]


def combine_rounds(rounds: list[dict], modes: list[str]) -> dict:
    """``--repeats``: the rounds summarised. Per mode, the run with the median samples/s stands for the mode
    (``modes``: what the calibration and the simulator use, as one run does) with every round's samples/s beside
    it; per async mode its ratio to colocated *within* each round (``ratios``: the rounds' list, median, min,
    max), and its fraction of that round's ideal bound (``of_ideal``); ``ideal``: the median round's bound. Every
    median is a round's own value (the lower middle one of an even count, as the median run is), so a ratio of
    two rounds is one of them, not their mean.
    Errors: none; a mode missing from a round (a failed run) is left out of that round's ratios."""
    out: dict[str, Any] = {"modes": {}, "ratios": {}, "of_ideal": {}}
    for m in modes:
        runs = [r["modes"][m] for r in rounds if m in r["modes"]]
        if not runs:
            continue
        sps = [x["samples_per_s"] for x in runs]
        median = sorted(runs, key=lambda x: x["samples_per_s"])[(len(runs) - 1) // 2]
        out["modes"][m] = {**median, "rounds_samples_per_s": sps}
        if m != "colocated":
            per = [r["modes"][m]["samples_per_s"] / r["modes"]["colocated"]["samples_per_s"] for r in rounds
                   if m in r["modes"] and r["modes"].get("colocated", {}).get("samples_per_s")]
            if per:
                out["ratios"][m] = {"rounds": per, "median": statistics.median_low(per), "min": min(per), "max": max(per)}
        fr = [r["modes"][m]["samples_per_s"] / r["ideal"]["ideal_samples_per_s"] for r in rounds
              if m in r["modes"] and r.get("ideal")]
        if fr:
            out["of_ideal"][m] = {"rounds": fr, "median": statistics.median_low(fr), "min": min(fr), "max": max(fr)}
    ideals = sorted((r["ideal"] for r in rounds if r.get("ideal")), key=lambda i: i["ideal_samples_per_s"])
    if ideals:
        out["ideal"] = {**ideals[(len(ideals) - 1) // 2], "rounds_samples_per_s": [i["ideal_samples_per_s"] for i in ideals]}
    return out


def save(result: dict, args: argparse.Namespace) -> None:
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))


def report(result: dict) -> None:
    modes = result["modes"]
    base = modes.get("colocated", {}).get("samples_per_s")
    ideal = result.get("ideal", {}).get("ideal_samples_per_s")
    if result.get("rounds"):
        print(f"\n(each mode's median run of {len(result['rounds'])} rounds, which may come from different rounds; its "
              "'x colocated' and 'of ideal' (the rounds' median bound) compare across rounds: the paired ratios per round "
              "are at the end)")
    w = max([10] + [len(m) for m in modes])  # colocated_dyn, d_unpinned ... keep their columns
    print(f"\n{'mode':{w}s} samples/s  x colocated  of ideal  step s  trainer idle  rollouter idle  lag mean/max  "
          "reward first->last  to target")
    for m, r in modes.items():
        x = f"{r['samples_per_s'] / base:9.2f}x" if base else "        -"
        f = f"{r['samples_per_s'] / ideal:8.2f}" if ideal else "       -"
        tt = f"{r['time_to_target_s']:.0f} s" if r["time_to_target_s"] is not None else "not reached"
        print(f"{m:{w}s} {r['samples_per_s']:9.3f} {x}  {f}  {r['step_s_median']:6.2f}  {r['trainer_idle_ratio']:12.2f}"
              f"  {r['rollouter_idle_ratio']:14.2f}  {r['lag_mean']:5.2f}/{r['lag_max']:<3d}  "
              f"{r['reward_first']:.2f} -> {r['reward_last']:.2f}  {tt}")
    steady = {m: r.get("steady_samples_per_s") or 0.0 for m, r in modes.items()}
    if any(steady.values()):  # GPU runs pay CUDA-graph captures and compiles in their first steps
        sb = steady.get("colocated") or 0.0
        print("steady state (after the first steps' warm-up): " + ", ".join(
            f"{m} {v:.3f} samples/s" + (f" ({v / sb:.2f}x)" if sb and m != "colocated" else "") for m, v in steady.items()))
    if ideal:
        i = result["ideal"]
        at = f" at {i['best_concurrency']} groups at once" if "best_concurrency" in i else ""
        print(f"ideal bound {ideal:.3f} samples/s = 1 / max(rollout-only{at} {i.get('best_rollout_s_per_sample', i['rollout_s_per_sample']):.3f},"
              f" train-only {i['train_s_per_sample']:.3f} s/sample)")
    for m, q in (result.get("priced") or {}).items():
        of = f" = {q['of_priced']:.2f} of it" if q["of_priced"] else ""
        of += " (the median run's share and samples/s, the median round's bound)" if result.get("rounds") else ""
        print(f"priced with the rest on the trainer's cores (--census): {m}: they took {q['share']:.2f} of those cores, "
              f"{q['glue_s_per_sample']:.3f} s a sample -> 1 / (train-only {result['ideal']['train_s_per_sample']:.3f} + "
              f"{q['glue_s_per_sample']:.3f}) = {q['train_samples_per_s']:.3f}; bound {q['bound_samples_per_s']:.3f} "
              f"samples/s; measured {modes[m]['samples_per_s']:.3f}{of}")
    sim = result.get("simulated") or {}
    if sim:
        print("\nsimulated (" + result.get("simulated_from", "asyncrl.sim calibrated on decode probes + train-only, "
                                                "alone and loaded, not on these runs") + "):")
        for m, r in sim.items():
            err = f"{100 * r['error']:+.0f}%" if r["error"] is not None else "-"
            steady = "" if r.get("steady_error") is None else (
                f"; steady {r['steady_samples_per_s']:.3f}, " if r.get("steady_samples_per_s") else "; ") + \
                f"{100 * r['steady_error']:+.0f}% vs steady"
            bare = r.get("without_contention_samples_per_s")
            was = f"; without the contention term {bare:.3f} ({100 * (bare / modes[m]['samples_per_s'] - 1):+.0f}%)" if bare else ""
            bound = f"; its own bound {r['bound']['samples_per_s']:.3f}" if r.get("bound") else ""
            print(f"{m:{w}s} {r['samples_per_s']:9.3f} samples/s ({err} vs measured{steady})  trainer idle {r['trainer_idle_ratio']:.2f}"
                  f"  rollouter idle {r['rollouter_idle_ratio']:.2f}{was}{bound}")
            print_split_beside(r, modes[m])
            if r.get("above_bound"):
                print(f"{'':10s} {r['above_bound']}")
    if result.get("rounds"):
        n = len(result["rounds"])
        print(f"\nover {n} rounds (each ratio within one round, its own ideal bound; median [min - max] (round 1, 2, ...)):")
        for m, r in modes.items():
            sps = r.get("rounds_samples_per_s") or []
            line = f"{m:10s} samples/s {statistics.median_low(sps):.3f} [{min(sps):.3f} - {max(sps):.3f}]" if sps else f"{m:10s}"
            for key, name in (("ratios", "x colocated"), ("of_ideal", "of ideal")):
                q = result.get(key, {}).get(m)
                if q:
                    line += f"   {name} {q['median']:.2f} [{q['min']:.2f} - {q['max']:.2f}] (" + \
                            ", ".join(f"{v:.2f}" for v in q["rounds"]) + ")"
            print(line)
    ref = result.get("reference")
    if ref and ref.get("step_s_median"):
        for m, r in modes.items():
            print(f"{m}: {r['step_s_median']:.3f} s/step vs reference loop {ref['step_s_median']:.3f} s/step "
                  f"({r['step_s_median'] / ref['step_s_median']:.2f}x)")


if __name__ == "__main__":
    from asyncrl.config import ConfigError

    try:
        main()
    except ConfigError as exc:  # one line, as the asyncrl CLI prints it
        print(f"config error: {exc}", file=sys.stderr)
        sys.exit(2)
