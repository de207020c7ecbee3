"""Named simulation scenarios: verl's published fully-async 7B experiment (colocated 128 GPUs vs fully async 64:64; verl
docs, "Recipe: Fully Async Policy Trainer"; the "seed" of this project, hence the names ``reproduce_seed``, ``SEED_RATIO``).

verl's fully-async recipe reports, for Qwen2.5-Math-7B + DAPO on H20 with responses up to 28K
tokens (verl docs "Asynchronous Training on 7B Model"; seed ``000`` section 1.1): colocated on 128
GPUs 356.3 s per step (generation 177.9, old log-prob 53.9, update 113.8), fully async 64:64 150.6 s
per step (waiting for samples 33.1, update 113.2), 2.35-2.67x in total time.
:func:`reproduce_seed` runs both shapes of that experiment in the simulator on the
:func:`~asyncrl.sim.presets.h20_qwen25_7b` cost model and breaks the step time down.

The response lengths are a lognormal law (median 450 tokens, log-std 1.5, clipped at 28,672: mean
~1.3K, 0.2% run to the cap, about one per 512-response mini-batch), the early phase of DAPO on
Qwen2.5-Math-7B; with it and the cost model, the simulated colocated components land near verl's
(generation ~200 s, update ~108 s). Everything else — how much the async run overlaps, how long the
trainer waits, the staleness — comes out of the real control logic.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from asyncrl.config import ExperimentConfig
from asyncrl.sim.cost_models import ClusterCostModel
from asyncrl.sim.presets import h20_qwen25_7b
from asyncrl.sim.runner import SimResult, simulate

SEED_RATIO = (2.35, 2.67)
"""verl's measured fully-async (64:64) over colocated (128) speed-up, total time."""
VERL_COLOCATED_STEP = {"step": 356.30, "gen": 177.85, "old_log_prob": 53.92, "update_actor": 113.81}
VERL_ASYNC_STEP = {"step": 150.63, "gen": 33.14, "update_actor": 113.16}
"""verl's per-step timings (seconds) of the two runs (verl docs, 128-card table)."""


def verl_dapo_7b(colocated: bool, *, steps: int = 8, token_scale: int = 64, median: float = 450.0,
                 sigma: float = 1.5, max_response: int = 28672) -> ExperimentConfig:
    """The config of verl's 7B experiment in asyncrl keys (``dapo_7b_math_fsdp2_64_64.sh``): the base config of
    GPU-scale what-ifs (with :func:`~asyncrl.sim.presets.h20_qwen25_7b` and :func:`~asyncrl.sim.sweep.sweep`, README
    "Async vs colocated"). ``rollout.response_length`` and the length workload's ``median`` are set in simulated
    tokens (real tokens / ``token_scale``): simulate it with the same ``token_scale``.

    Both: rollout.n 16, ppo_mini_batch_size 32 prompts, responses from the length workload.
    Colocated: ``hybrid_engine``, 512 prompts per step (require_batches 16: 16 updates), old
    log-probs recomputed when the trainer supports it (verl's colocated default). Async: mode d
    with require_batches 4, trigger_parameter_sync_step 4 (512 prompts per sync), staleness 0.5.

    Args:
        colocated: which of the two.
        steps: trainer steps (a colocated step is 512 prompts, an async one 128).
        token_scale: real tokens per simulated token.
        median, sigma, max_response: the response-length law in real tokens.
    """
    cfg = ExperimentConfig()
    cfg.trainer.total_training_steps = steps
    cfg.trainer.test_freq = 0
    cfg.trainer.watchdog_timeout_s = 1800.0  # a colocated step of this size takes ~340 s: not a hang
    cfg.trainer.experiment_name = "verl_dapo_7b_" + ("colocated" if colocated else "async")
    cfg.data.train_size = 2048
    ro = cfg.actor_rollout_ref.rollout
    ro.n, ro.response_length, ro.max_num_seqs = 16, max_response // token_scale, 256
    ro.concurrent_samples_per_replica = 16  # 16 groups x 16 responses = the replica's 256 sequences
    ro.agent.num_workers = 0
    lw = cfg.data.length_workload
    lw.distribution, lw.median, lw.sigma, lw.min_tokens = "lognormal", median / token_scale, sigma, 1
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 32
    at = cfg.async_training
    if colocated:
        cfg.actor_rollout_ref.hybrid_engine = True
        at.require_batches, at.trigger_parameter_sync_step, at.staleness_threshold = 16, 1, 0.0
        rc = getattr(cfg.algorithm, "rollout_correction", None)
        if rc is not None and hasattr(rc, "bypass_mode"):
            rc.bypass_mode = False  # verl's colocated run recomputes old log-probs
    else:
        at.require_batches, at.trigger_parameter_sync_step = 4, 4
        at.staleness_threshold, at.partial_rollout = 0.5, True
    return cfg


@dataclasses.dataclass
class SeedReproduction:
    """Colocated vs async on verl's 7B experiment, per 512 prompts (one verl step)."""

    colocated: SimResult
    fully_async: SimResult
    ratio: float
    """Async samples/s over colocated samples/s in steady state (pipeline fill excluded)."""

    def breakdown(self):
        """Seconds per 512 prompts by phase, simulated beside verl's measured numbers (a DataFrame)."""
        import pandas as pd

        def mean(res: SimResult, key: str, skip: int) -> float:
            vals = [r.get(key, 0.0) for r in res.history[skip:]]
            return sum(vals) / max(1, len(vals))

        c, a = self.colocated, self.fully_async
        per_sync = a.config.async_training.trigger_parameter_sync_step
        c_step, a_step = c.step_time(0), a.step_time(per_sync) * per_sync
        c_update = mean(c, "timing/update_s", 0)
        rows = [
            {"run": "colocated 128", "step_s": c_step, "generation_s": mean(c, "timing/gen_s", 0),
             "update_s": c_update, "trainer_wait_s": mean(c, "timing/gen_s", 0),
             "sync_s": mean(c, "sync/total_s", 0), "verl_step_s": VERL_COLOCATED_STEP["step"],
             "verl_update_s": VERL_COLOCATED_STEP["update_actor"]},
            {"run": "async 64:64", "step_s": a_step, "generation_s": float("nan"),
             "update_s": mean(a, "timing/update_s", per_sync) * per_sync,
             "trainer_wait_s": mean(a, "timing/fetch_s", per_sync) * per_sync,
             "sync_s": mean(a, "sync/total_s", per_sync) * per_sync, "verl_step_s": VERL_ASYNC_STEP["step"],
             "verl_update_s": VERL_ASYNC_STEP["update_actor"]},
        ]
        return pd.DataFrame(rows)


def reproduce_seed(cost: Optional[ClusterCostModel] = None, *, colocated_steps: int = 2, async_steps: int = 12,
                   token_scale: int = 64, **length_law: Any) -> SeedReproduction:
    """Simulate verl's comparison: colocated on 128 GPUs vs fully async on 64 rollout + 64 trainer GPUs.

    Takes ~15-35 s on one core of the 2-core CPU box at full scale (16K responses per colocated step through the real
    rollouter; 15 s and 21 s measured with the box otherwise idle). Returns a :class:`SeedReproduction` (``ratio`` to
    compare with :data:`SEED_RATIO`).
    """
    cost = cost or h20_qwen25_7b()
    col = simulate(verl_dapo_7b(True, steps=colocated_steps, token_scale=token_scale, **length_law), cost,
                   rollout_gpus=128, train_gpus=128, token_scale=token_scale, name="colocated 128")
    asy = simulate(verl_dapo_7b(False, steps=async_steps, token_scale=token_scale, **length_law), cost,
                   rollout_gpus=64, train_gpus=64, token_scale=token_scale, name="async 64:64")
    per_sync = asy.config.async_training.trigger_parameter_sync_step
    ratio = col.step_time(0) / (asy.step_time(per_sync) * per_sync)
    return SeedReproduction(col, asy, ratio)
