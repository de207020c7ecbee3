"""Calibrate a cost model from micro-measurements of the real engines, to predict full runs.

::

    probe_decode(replica)  B concurrent ignore-EOS requests of T tokens, B in batch_sizes
        -> seconds per decode iteration at each B -> least squares: step_s + per_seq_s * B
    train seconds / trained tokens (the train engine alone)     -> per_token_s
    the weight sync's transfer + load (a measured run's sync/*)  -> SyncCostModel.fixed_s
    response lengths of the workload (the replica alone)        -> natural_length sampler
    the same probe / train-only with the other side busy        -> contention(alone, loaded)
        => ClusterCostModel; simulate(config, model, natural_length=...) predicts the run

The calibration never looks at the full runs it is meant to predict: only at what one engine does
alone, which is the point (a user measures the engines once, then asks the simulator about configs).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any, Callable, Optional, Sequence

from asyncrl.sim.cost_models import ClusterCostModel, RolloutCostModel, SyncCostModel, TrainCostModel


async def probe_decode(replica: Any, prompt_ids: Sequence[int], batch_sizes: Sequence[int] = (1, 8, 32, 128),
                       tokens: int = 64, repeats: int = 2) -> dict[int, float]:
    """Seconds per decode iteration with ``B`` sequences running, for each ``B`` (best of ``repeats``).

    Each probe starts ``B`` requests of exactly ``tokens`` tokens (EOS ignored) at once and divides
    the wall time by ``tokens`` (the prefill is included, spread over the iterations, as in a run).

    Args:
        replica: a :class:`~asyncrl.rollout.replica.RolloutReplica` (or anything with ``generate_async``).
        prompt_ids: the prompt every request uses (the workload's typical length).
    """
    from asyncrl.rollout.base import SamplingParams

    sp = SamplingParams(max_tokens=tokens, temperature=1.0, ignore_eos=True, logprobs=True)
    out: dict[int, float] = {}
    for b in batch_sizes:
        best = float("inf")
        for r in range(repeats):
            t0 = time.perf_counter()
            await asyncio.gather(*[replica.generate_async(f"probe-{b}-{r}-{i}", list(prompt_ids), sp) for i in range(b)])
            best = min(best, time.perf_counter() - t0)
        out[int(b)] = best / tokens
    return out


def fit_rollout(per_iteration_s: dict, max_num_seqs: int = 256, weight_load_s: float = 0.0) -> RolloutCostModel:
    """Least-squares line ``t(B) = step_s + per_seq_s * B`` through the probe (KV reads folded in)."""
    bs, ts = list(per_iteration_s), list(per_iteration_s.values())
    n = len(bs)
    mb, mt = sum(bs) / n, sum(ts) / n
    var = sum((b - mb) ** 2 for b in bs)
    slope = sum((b - mb) * (t - mt) for b, t in zip(bs, ts)) / var if var else 0.0
    slope = max(0.0, slope)
    intercept = max(1e-6, mt - slope * mb)
    return RolloutCostModel(step_s=intercept, per_seq_s=slope, per_ctx_token_s=0.0, weight_load_s=weight_load_s,
                            max_num_seqs=max_num_seqs)


def contention(alone: Any, loaded: Any) -> float:
    """The contention term of a cost model (:mod:`asyncrl.sim.cost_models`, Contention): how much
    longer the same work took with the other side of the run busy than alone, ``loaded / alone - 1``.

    Args:
        alone, loaded: seconds of the same measurement, either two numbers (train-only seconds per
            token) or two :func:`probe_decode` results (``{B: s/iteration}``; the median of the
            per-``B`` ratios is used, so one noisy batch size does not decide it).

    Returns:
        The fractional slowdown, ``>= 0`` (a faster loaded run is noise, not a speed-up).
    """
    if isinstance(alone, dict):
        ratios = sorted(loaded[b] / alone[b] for b in alone if b in loaded and alone[b] > 0)
        if not ratios:
            raise ValueError("the two probes share no batch size")
        mid = len(ratios) // 2
        ratio = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
    else:
        if alone <= 0:
            raise ValueError(f"alone must be > 0 seconds, got {alone}")
        ratio = loaded / alone
    return max(0.0, ratio - 1.0)


def cpu_cost_model(decode_probe: dict, train_s_per_token: float, sync_s: float, prompt_tokens: int,
                   per_update_s: float = 0.0, name: str = "cpu-calibrated", rollout_contention: float = 0.0,
                   train_contention: float = 0.0) -> ClusterCostModel:
    """A cost model of one CPU placement (one replica, one trainer) from its micro-measurements.

    Args:
        decode_probe: :func:`probe_decode` output for the replica's placement.
        train_s_per_token: train-only seconds per trained token (prompt + response) at the trainer's placement.
        sync_s: seconds of one weight sync's transfer + load (``sync/transfer_total_s`` of a run).
        prompt_tokens: mean prompt length.
        rollout_contention, train_contention: :func:`contention` of the decode probe and of train-only
            (the engine alone vs with the other side busy); 0 when the sides never overlap.
    """
    rollout = fit_rollout(decode_probe)
    rollout.contention = rollout_contention
    return ClusterCostModel(
        name=name, rollout=rollout,
        train=TrainCostModel(per_token_s=train_s_per_token, per_update_s=per_update_s, contention=train_contention),
        sync=SyncCostModel(fixed_s=sync_s), prompt_tokens=prompt_tokens,
        notes="calibrated from probe_decode + train-only (alone and with the other side busy) + a run's sync time")


def empirical_lengths(lengths: Sequence[int]) -> Callable[..., int]:
    """``natural_length(request_id, prompt_ids=None)``: a length drawn from ``lengths``, fixed per request id."""
    pool = sorted(int(x) for x in lengths)
    if not pool:
        raise ValueError("no lengths to sample from")

    def draw(request_id: str, prompt_ids: Any = None) -> int:
        h = int.from_bytes(hashlib.md5(request_id.encode()).digest()[:8], "big")
        return pool[h % len(pool)]

    return draw


def lengths_from_rows(rows: Sequence[dict], tokenizer: Any) -> Optional[Callable[..., Optional[int]]]:
    """``natural_length`` from rows that carry their correct answer's length (``extra_info.response_tokens``,
    e.g. the ``longtail`` task): the simulated model answers every prompt at exactly that length.
    ``None`` when the rows carry none."""
    from asyncrl.agent_loop.single_turn import render_prompt_ids

    by_prompt = {tuple(render_prompt_ids(tokenizer, r["prompt"])): int(r["extra_info"]["response_tokens"])
                 for r in rows if (r.get("extra_info") or {}).get("response_tokens")}
    if not by_prompt:
        return None
    fallback = sorted(by_prompt.values())[len(by_prompt) // 2]

    def length(request_id: str, prompt_ids: Sequence[int] = ()) -> int:
        return by_prompt.get(tuple(prompt_ids), fallback)

    return length


async def measure_rollout(replica: Any, cfg: Any, rows: Sequence[dict], groups: int) -> tuple[float, list]:
    """The replica alone: ``groups`` prompt groups x ``rollout.n`` of ``rows`` with the training
    sampling parameters, at most ``max_concurrent_samples`` groups at once (the async budget).

    Returns:
        ``(seconds, [(group index, prompt_ids, [TokenOutput] * n, [reward] * n)])``: each response scored
        by the task's rule reward (:func:`asyncrl.reward.compute_score`), as the agent loops score them,
        so :func:`measure_train` trains on the advantages the trainer would.
    """
    from asyncrl.reward import compute_score

    from asyncrl.agent_loop.single_turn import render_prompt_ids
    from asyncrl.data.length_workload import LengthWorkload
    from asyncrl.models import load_tokenizer
    from asyncrl.rollout.base import SamplingParams
    from asyncrl.staleness import sample_budget

    tok = load_tokenizer(cfg.actor_rollout_ref.model.tokenizer_path or cfg.actor_rollout_ref.model.path)
    ro = cfg.actor_rollout_ref.rollout
    sp = SamplingParams(max_tokens=ro.response_length, temperature=ro.temperature, top_p=ro.top_p, logprobs=True,
                        stop_token_ids=[tok.eos_token_id] if tok.eos_token_id is not None else [])
    wl = LengthWorkload(cfg.data.length_workload, ro.response_length, cfg.trainer.seed)
    limit = asyncio.Semaphore(sample_budget(cfg).max_concurrent_samples)
    outputs: list = []

    async def group(i: int) -> None:
        async with limit:
            row = rows[i % len(rows)]
            prompt = render_prompt_ids(tok, row["prompt"])
            sps = wl.sampling_params(sp, i, ro.n) if wl.enabled else [sp] * ro.n
            outs = await asyncio.gather(*[replica.generate_async(f"measure-{time.time_ns()}-{i}-{k}", prompt, sps[k])
                                          for k in range(ro.n)])
            rewards = []
            for o in outs:
                score = compute_score(row.get("data_source", ""), tok.decode(o.token_ids, skip_special_tokens=True),
                                      row["reward_model"]["ground_truth"], row.get("extra_info"))
                rewards.append(float(score["score"] if isinstance(score, dict) else score))
            outputs.append((i, prompt, outs, rewards))

    t0 = time.perf_counter()
    await asyncio.gather(*[group(i) for i in range(groups)])
    return time.perf_counter() - t0, outputs


def measure_train(cfg: Any, outputs: list, min_seconds: float = 0.0) -> dict:
    """The trainer's own engine alone (:func:`asyncrl.trainer.factory.build_cpu_train_engine`), at
    ``cfg``'s trainer placement (``trainer.cpu_affinity`` / ``torch_threads``), updating on
    :func:`measure_rollout` outputs the way a trainer step does: ``require_batches`` mini-batches of
    ``required_samples`` groups, advantages from the responses' own rewards by the configured estimator
    (so rows whose advantage is 0 are skipped as the trainer skips them), after one untimed warm-up step.
    Pins the calling process: run
    it in a fresh process (e.g. a Ray task with ``max_calls=1``). ``min_seconds``: go over the outputs
    again until at least that long has been spent (a steady load beside another measurement).

    Returns:
        ``{"seconds", "steps", "tokens", "s_per_token", "s_per_sample"}`` (``tokens``: real tokens of the
        rows stepped over, prompt + response, skipped rows included, as the simulator counts them).

    Raises:
        ValueError: no outputs, or outputs without their rewards (not from :func:`measure_rollout`).
    """
    import os

    import torch

    from asyncrl.agent_loop.base import AgentLoopOutput
    from asyncrl.cpu_affinity import pin_process
    from asyncrl.staleness import sample_budget
    from asyncrl.trainer.factory import build_cpu_train_engine
    from asyncrl.trainer.update import actor_loss_fn

    if not outputs:
        raise ValueError("measure_train needs measure_rollout outputs; got none")
    if any(len(item) != 4 for item in outputs):
        raise ValueError("measure_train needs measure_rollout outputs (group, prompt_ids, outputs, rewards): "
                         "the rewards decide which rows the trainer skips")
    if not cfg.trainer.cpu_affinity and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    pin_process(cfg.trainer.cpu_affinity, torch_threads=False)
    torch.set_num_threads(cfg.trainer.torch_threads)
    engine = build_cpu_train_engine(cfg)
    groups = [[AgentLoopOutput(prompt_ids=list(prompt), response_ids=list(o.token_ids), response_mask=[1] * len(o.token_ids),
                               response_logprobs=list(o.log_probs or [0.0] * len(o.token_ids)), reward_score=r,
                               response_versions=list(o.response_versions))
               for o, r in zip(outs, rewards)] for _, prompt, outs, rewards in outputs]
    req = sample_budget(cfg).required_samples
    per_mb = max(1, req // cfg.async_training.require_batches)
    if len(groups) < req:  # fewer groups than one step (notebook 06 at smoke size): reuse them to fill one,
        groups = [groups[k % len(groups)] for k in range(req)]  # else no step ran and s_per_token read 0

    loss_fn = actor_loss_fn(cfg)
    steps, seconds, tokens = 0, 0.0, 0
    starts = list(range(0, len(groups) - req + 1, req))
    # one untimed step first: a fresh process's first update pays allocations and thread start-up, which the
    # simulator (steady cost per token, no warm-up) must not spread over every step
    _train_step(cfg, engine, loss_fn, groups[:req], req, per_mb)
    while True:
        for start in starts:
            dt, n = _train_step(cfg, engine, loss_fn, groups[start:start + req], req, per_mb)
            seconds, tokens, steps = seconds + dt, tokens + n, steps + 1
        if seconds >= min_seconds or not starts:
            break
    return {"seconds": seconds, "steps": steps, "tokens": tokens, "s_per_token": seconds / max(1, tokens),
            "s_per_sample": seconds / max(1, steps * req)}


def _train_step(cfg: Any, engine: Any, loss_fn: Any, step: list, req: int, per_mb: int) -> tuple[float, int]:
    """One trainer step's updates on ``step`` (``req`` groups): ``(seconds, tokens)``. Scores, token
    rewards and advantages as :meth:`FullyAsyncTrainer.fit_step` computes them (bypass mode: the rollout's
    log-probs are the old ones; no critic or reference)."""
    from asyncrl.trainer.advantages import compute_advantages
    from asyncrl.trainer.engine import collate
    from asyncrl.trainer.rewards import shaped_scores, token_level_rewards

    al = cfg.algorithm
    t0, tokens = time.perf_counter(), 0
    for m in range(0, req, per_mb):
        part = step[m:m + per_mb]
        batch = collate([o for g in part for o in g], [j for j, g in enumerate(part) for _ in g])
        scores = shaped_scores(batch.rewards, batch.response_lengths, cfg)
        token_rewards, _ = token_level_rewards(scores, batch.response_mask)
        advantages, returns = compute_advantages(al.adv_estimator, token_rewards, batch.response_mask,
                                                 batch.group_ids, al)
        batch.extras.update(old_log_probs=batch.rollout_log_probs, advantages=advantages, returns=returns)
        engine.update(batch, loss_fn)
        tokens += int(batch.attention_mask.sum())
    return time.perf_counter() - t0, tokens
