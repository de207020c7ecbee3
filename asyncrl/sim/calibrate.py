"""Calibrate a cost model from micro-measurements of the real engines, to predict full runs.

::

    probe_decode(replica)  B concurrent ignore-EOS requests of T tokens, B in batch_sizes
        -> seconds per decode iteration at each B -> least squares: step_s + per_seq_s * B
    probe_token_costs(replica)  one-token requests and the probe at a long prompt (asyncrl.sim.probes)
        -> per_prefill_token_s, per_ctx_token_s (a resumed partial rollout's prefill, a long context's reads)
    rollout-only of the workload (measure_rollout, timed)       -> fit_per_request: the per-request cost the
        probe's long fixed-length requests hide, and the probe net of it as a table (session 10)
    train seconds / priced tokens (the train engine alone)      -> per_token_s (a price per token through the
                                                                   model: the prefix grouper's plans priced too)
    the weight sync's transfer + load (a measured run's sync/*)  -> SyncCostModel.fixed_s
    response lengths of the workload (the replica alone)        -> natural_length sampler
    the same probe / train-only with the other side busy        -> contention(alone, loaded)
        => ClusterCostModel; simulate(config, model, natural_length=...) predicts the run

The calibration never looks at the full runs it is meant to predict: only at what one engine does
alone, which is the point (a user measures the engines once, then asks the simulator about configs).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Optional, Sequence

from asyncrl.sim.cost_models import ClusterCostModel, RolloutCostModel, SyncCostModel, TrainCostModel
from asyncrl.sim.probes import TokenCosts, probe_decode  # noqa: F401 - probe_decode's home before session 34
from asyncrl.sim.workload import empirical_lengths, lengths_from_rows  # noqa: F401 - their home before session 14


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


def simulate_rollout_only(cost: RolloutCostModel, group_lengths: Sequence[Sequence[int]], concurrency: int,
                          prompt_tokens: int) -> float:
    """Virtual seconds the replica priced by ``cost`` takes for :func:`measure_rollout`'s work: the groups in
    order, at most ``concurrency`` groups at once, each group's requests (``group_lengths[i]``: real
    response tokens) started together and stopping at their length. The simulator's own rollout-only,
    to set beside the measured one (and the bound a simulated run cannot beat at that concurrency)."""
    from asyncrl.rollout.base import SamplingParams
    from asyncrl.sim.clock import run
    from asyncrl.sim.engines import CostModelInferenceEngine

    lengths = {f"g{i}-{k}": max(1, int(n)) for i, g in enumerate(group_lengths) for k, n in enumerate(g)}
    longest = max(lengths.values(), default=1)

    async def go() -> float:
        engine = CostModelInferenceEngine(cost, prompt_tokens=prompt_tokens,
                                          natural_length=lambda rid, prompt_ids=(): lengths[rid])
        limit = asyncio.Semaphore(max(1, int(concurrency)))
        sp = SamplingParams(max_tokens=longest, logprobs=True)

        async def group(i: int, g: Sequence[int]) -> None:
            async with limit:
                await asyncio.gather(*[engine.generate(f"g{i}-{k}", [1] * prompt_tokens, sp) for k in range(len(g))])

        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.gather(*[group(i, g) for i, g in enumerate(group_lengths)])
        return loop.time() - t0

    return run(go)


def fit_per_request(decode_probe: dict, probe_tokens: int, group_lengths: Sequence[Sequence[int]], concurrency: int,
                    seconds: float, prompt_tokens: int, max_num_seqs: int = 256,
                    more: Sequence[dict] = (), token_costs: Optional[TokenCosts] = None) -> RolloutCostModel:
    """A rollout cost model that reproduces both micro-measurements of the replica alone: the decode probe
    (``B`` requests of ``probe_tokens`` tokens at once, :func:`probe_decode`) and a rollout-only
    measurement of the workload (:func:`measure_rollout`: ``group_lengths`` at ``concurrency`` groups took
    ``seconds``).

    The probe's requests all run ``probe_tokens`` tokens; the workload's are mostly short (long-tail task:
    median 14 tokens), so what a request costs once (admission, prefill of its prompt, its output's trip
    back; a resume after an abort pays only its recomputed context: :mod:`asyncrl.sim.engines`) weighs ~3x more per token in a run than in the probe, and a
    model fitted to the probe alone runs the workload too fast (1.2-1.4x on the 2-core box, and more
    so the more requests it keeps in flight). The per-request cost ``c`` (:attr:`RolloutCostModel.prefill_s`,
    which blocks the replica as the real engine's admission does) is found by bisection so that
    :func:`simulate_rollout_only` takes ``seconds``; the probe is taken net of it, as a table
    (:attr:`RolloutCostModel.per_iteration_s`: ``probe(B) - B * c / probe_tokens``), so the model still
    reproduces the probe. ``c = 0`` when the probe alone already runs the workload as slowly as measured.

    ``more``: further rollout-only measurements of the same replica (:func:`rollout_only` dicts: ``groups``,
    ``concurrency``, ``seconds``), fitted together with the first: ``c`` makes the simulated seconds of all of
    them add up to the measured ones. On a long-tail workload one measurement of 64 groups is a noisy price (the
    same 64 groups at concurrency 48, twice on one replica minutes apart: 5.16 and 3.87 s, ``benchmarks/RESULTS.md``
    session 16).

    ``token_costs`` (:func:`asyncrl.sim.probes.probe_token_costs`, since session 34): the model also prices
    prefill per prompt token and decode per context token; the probe is taken net of its own share of both
    (:meth:`TokenCosts.probe_share`), and ``c`` is what a request costs beyond them.
    """
    probe = {int(b): float(t) for b, t in decode_probe.items()}
    c_max = per_request_cap(probe, probe_tokens, token_costs)
    runs = [(group_lengths, concurrency)] + [(m["groups"], m["concurrency"]) for m in more]
    seconds = seconds + sum(float(m["seconds"]) for m in more)

    def model(c: float) -> RolloutCostModel:
        return probe_model(probe, c, probe_tokens, token_costs, max_num_seqs)

    def simulated(c: float) -> float:
        return sum(simulate_rollout_only(model(c), g, k, prompt_tokens) for g, k in runs)

    lo, hi = 0.0, c_max
    if simulated(0.0) >= seconds:
        return model(0.0)
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if simulated(mid) < seconds else (lo, mid)
        if hi - lo < 1e-6:
            break
    return model((lo + hi) / 2)


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


def per_request_cap(decode_probe: dict, probe_tokens: int, token_costs: Optional[TokenCosts] = None) -> float:
    """The largest per-request cost a probe can be taken net of: 95% of its smallest time per request
    (``t(B) * probe_tokens / B``, less what ``token_costs`` price of it). Above it some table entry is <= 0:
    the whole probe time spent on admission."""
    tc = token_costs or TokenCosts()
    return min((float(t) - tc.probe_share(int(b), probe_tokens)) * probe_tokens / int(b)
               for b, t in decode_probe.items()) * 0.95


def net_of_per_request(decode_probe: dict, per_request_s: float, probe_tokens: int,
                       token_costs: Optional[TokenCosts] = None) -> dict:
    """The probe's seconds per decode iteration with the per-request cost taken out: each of a probe's ``B``
    requests paid ``per_request_s`` once over its ``probe_tokens`` iterations (:func:`fit_per_request`); and with
    ``token_costs``, their prefill and context share too (:meth:`TokenCosts.probe_share`).

    Raises:
        ValueError: ``token_costs`` price more than some probe entry took (the table would hold a time <= 0).
    """
    tc = token_costs or TokenCosts()
    out = {int(b): float(t) - int(b) * per_request_s / probe_tokens - tc.probe_share(int(b), probe_tokens)
           for b, t in decode_probe.items()}
    if token_costs is not None and any(t <= 0 for t in out.values()):
        raise ValueError(f"token costs {token_costs} price more than the decode probe {decode_probe} took: "
                         "were they measured on another replica or another prompt?")
    return out


def probe_model(decode_probe: dict, per_request_s: float, probe_tokens: int, token_costs: Optional[TokenCosts] = None,
                max_num_seqs: int = 256) -> RolloutCostModel:
    """The rollout cost model of a decode probe: its table net of the per-request cost (:attr:`~RolloutCostModel.
    prefill_s`) and of ``token_costs`` (prefill per prompt token, decode per context token), which it charges apart."""
    tc = token_costs or TokenCosts()
    return RolloutCostModel(step_s=0.0, per_seq_s=0.0, per_ctx_token_s=tc.per_ctx_token_s, prefill_s=per_request_s,
                            per_prefill_token_s=tc.per_prefill_token_s, max_num_seqs=max_num_seqs,
                            per_iteration_s=net_of_per_request(decode_probe, per_request_s, probe_tokens, token_costs))


def cpu_cost_model(decode_probe: dict, train_s_per_token: float, sync_s: float, prompt_tokens: int,
                   per_update_s: float = 0.0, name: str = "cpu-calibrated", rollout_contention: float = 0.0,
                   train_contention: float = 0.0, per_request_s: Optional[float] = None,
                   probe_tokens: int = 48, token_costs: Optional[TokenCosts] = None,
                   shared_prefix: Optional[bool] = None) -> ClusterCostModel:
    """A cost model of one CPU placement (one replica, one trainer) from its micro-measurements.

    Args:
        decode_probe: :func:`probe_decode` output for the replica's placement.
        train_s_per_token: train-only seconds per trained token (prompt + response) at the trainer's placement.
        sync_s: seconds of one weight sync's transfer + load (``sync/transfer_total_s`` of a run).
        prompt_tokens: mean prompt length.
        rollout_contention, train_contention: :func:`contention` of the decode probe and of train-only
            (the engine alone vs with the other side busy); 0 when the sides never overlap.
        per_request_s: ``None``: a least-squares line through the probe (before session 10). A number (from
            :func:`fit_per_request`, 0 included): the probe as a table net of that per-request cost
            (:attr:`RolloutCostModel.per_iteration_s`) and the cost charged per request
            (:attr:`RolloutCostModel.prefill_s`), capped at :func:`per_request_cap` of this probe;
            ``probe_tokens``: the probe's tokens per request.
        token_costs: with ``per_request_s``, the replica's prefill and context prices
            (:func:`asyncrl.sim.probes.probe_token_costs`), charged apart and taken out of the probe. Refused with
            ``per_request_s=None``: the least-squares line has no per-request term to take them out of, and adding
            them on top would charge the probe's own prefill and context twice.
        train_s_per_token: with ``use_dynamic_bsz`` runs, per *priced* token (``measure_train``'s
            ``s_per_priced_token``, :func:`priced_tokens`).
        shared_prefix: :attr:`TrainCostModel.shared_prefix`: ``measure_train``'s ``use_prefix_grouper`` (whether
            the price was measured with the grouper's plans); None: as the simulated config says.

    Raises:
        ValueError: ``token_costs`` given with ``per_request_s=None``.
    """
    if per_request_s is None and token_costs is not None:
        raise ValueError(f"cpu_cost_model: token_costs={token_costs} need per_request_s (a number, 0.0 included, e.g. "
                         "fit_per_request's): the least-squares line of per_request_s=None would charge them twice; "
                         "pass per_request_s, or drop token_costs")
    if per_request_s is None:
        rollout = fit_rollout(decode_probe)
    else:
        # a cost fitted on another placement's probe (the split replica's, for the shared one) may exceed
        # what this probe spends per request (session 11: 11.1 ms vs the shared probe's 8.1 ms at B = 128,
        # a table entry of -7.8 ms and a simulation that never advanced): capped at this probe's own bound
        per_request_s = min(per_request_s, per_request_cap(decode_probe, probe_tokens, token_costs))
        rollout = probe_model(decode_probe, per_request_s, probe_tokens, token_costs)
    rollout.contention = rollout_contention
    return ClusterCostModel(
        name=name, rollout=rollout,
        train=TrainCostModel(per_token_s=train_s_per_token, per_update_s=per_update_s, contention=train_contention,
                             shared_prefix=shared_prefix),
        sync=SyncCostModel(fixed_s=sync_s), prompt_tokens=prompt_tokens,
        notes="calibrated from probe_decode + train-only (alone and with the other side busy) + a run's sync time")


async def measure_rollout(replica: Any, cfg: Any, rows: Sequence[dict], groups: int) -> tuple[float, list]:
    """The replica alone: ``groups`` prompt groups x ``rollout.n`` of ``rows`` with the training
    sampling parameters, at most ``max_concurrent_samples`` groups at once (the async budget).

    Returns:
        ``(seconds, [(group index, prompt_ids, [TokenOutput] * n, [reward] * n)])``: each response scored
        by the run's reward (:func:`asyncrl.reward.custom.scorer`: ``custom_reward_function``, else the rule
        reward of the row's ``data_source``), as the agent loops score them,
        so :func:`measure_train` trains on the advantages the trainer would.
    """
    from asyncrl.agent_loop.single_turn import render_prompt_ids
    from asyncrl.data.length_workload import LengthWorkload
    from asyncrl.models import load_tokenizer
    from asyncrl.reward.custom import scorer
    from asyncrl.reward.result import score_sample
    from asyncrl.rollout.base import SamplingParams
    from asyncrl.staleness import sample_budget

    tok = load_tokenizer(cfg.actor_rollout_ref.model.tokenizer_path or cfg.actor_rollout_ref.model.path)
    ro = cfg.actor_rollout_ref.rollout
    sp = SamplingParams(max_tokens=ro.response_length, temperature=ro.temperature, top_p=ro.top_p, logprobs=True,
                        stop_token_ids=[tok.eos_token_id] if tok.eos_token_id is not None else [])
    wl = LengthWorkload(cfg.data.length_workload, ro.response_length, cfg.trainer.seed)
    limit = asyncio.Semaphore(sample_budget(cfg).max_concurrent_samples)
    compute_score = scorer(cfg)
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
                rewards.append(score_sample(compute_score, row.get("data_source", ""),
                                            tok.decode(o.token_ids, skip_special_tokens=True),
                                            row["reward_model"]["ground_truth"], row.get("extra_info"),
                                            where=f"row {i % len(rows)}").score)
            outputs.append((i, prompt, outs, rewards))

    t0 = time.perf_counter()
    await asyncio.gather(*[group(i) for i in range(groups)])
    return time.perf_counter() - t0, outputs


def rollout_only(cfg: Any, seconds: float, outputs: list) -> dict:
    """A timed :func:`measure_rollout` as :func:`fit_per_request` reads it (and the benchmark saves it):
    ``{"seconds", "concurrency": max_concurrent_samples, "groups": [response lengths per group, in start order]}``;
    the flattened ``groups`` are the lengths the simulator draws from (:func:`empirical_lengths`)."""
    from asyncrl.staleness import sample_budget

    return {"seconds": float(seconds), "concurrency": sample_budget(cfg).max_concurrent_samples,
            "groups": [[len(o.token_ids) for o in outs] for _, _, outs, _ in sorted(outputs, key=lambda x: x[0])]}


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
        ``{"seconds", "steps", "tokens", "s_per_token", "priced_tokens", "s_per_priced_token",
        "trained_priced_tokens", "s_per_trained_priced_token", "trained_rows_frac", "s_per_sample",
        "use_prefix_grouper"}`` (the last: whether the engine ran the prefix grouper, whose plans the priced tokens
        then count as :class:`TrainCostModel` with ``shared_prefix=True`` prices them)
        (``tokens``: real tokens of the rows stepped over, prompt + response, skipped rows included;
        ``priced_tokens``: the same rows as the simulator prices them, :func:`priced_tokens`, whose price
        ``s_per_priced_token`` is the one to give :class:`TrainCostModel` when the simulation prices every row;
        ``trained_priced_tokens``: only the rows the engine trained (a non-zero advantage), whose price
        ``s_per_trained_priced_token`` goes with a simulation given the workload's ``gradient_fraction``;
        ``s_per_priced_token`` embeds this sample's share of rows the engine trained, ``trained_rows_frac``
        (rows with a gradient, and one row of a mini-batch that has none), which a run's own share can differ
        from as its policy learns).

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
    steps, seconds, tokens, priced, trained, rows, kept = 0, 0.0, 0, 0.0, 0.0, 0, 0
    starts = list(range(0, len(groups) - req + 1, req))
    # one untimed step first: a fresh process's first update pays allocations and thread start-up, which the
    # simulator (steady cost per token, no warm-up) must not spread over every step
    _train_step(cfg, engine, loss_fn, groups[:req], req, per_mb, False)
    grouper = bool(getattr(engine, "use_prefix_grouper", False))  # after its first plan: off for a length-set rope
    while True:
        for start in starts:
            dt, n, p, t, r, k = _train_step(cfg, engine, loss_fn, groups[start:start + req], req, per_mb, grouper)
            seconds, tokens, priced, steps = seconds + dt, tokens + n, priced + p, steps + 1
            trained, rows, kept = trained + t, rows + r, kept + k
        if seconds >= min_seconds or not starts:
            break
    return {"seconds": seconds, "steps": steps, "tokens": tokens, "s_per_token": seconds / max(1, tokens),
            "priced_tokens": priced, "s_per_priced_token": seconds / max(1.0, priced),
            "trained_priced_tokens": trained, "s_per_trained_priced_token": seconds / max(1.0, trained),
            "trained_rows_frac": kept / max(1, rows), "s_per_sample": seconds / max(1, steps * req),
            "use_prefix_grouper": grouper}


def priced_tokens(lengths: Sequence[float], max_token_len: Optional[int] = None, groups: Optional[Sequence] = None,
                  prompts: Optional[Sequence[float]] = None, shared_prefix: bool = False,
                  micro_batch_rows: Optional[int] = None) -> float:
    """The tokens :class:`TrainCostModel` prices one update of rows of ``lengths`` (real tokens each) at, with
    ``per_token_s = 1``: their sum, or with ``max_token_len`` (``use_dynamic_bsz``) each packed micro-batch's
    rows x its longest row. Dividing a measured update's seconds by this, not by the real tokens, is what
    makes the simulator reproduce the measurement: it pads each micro-batch itself, so a per-real-token price
    (which already includes the padding the real engine computed) would be padded twice (long-tail task:
    x1.1-1.46 per mini-batch, 1.24 on average, the simulated update ~25% long). With ``shared_prefix`` (an engine
    that ran the prefix grouper) and ``groups`` / ``prompts`` (``(rows,)`` group ids, prompt tokens), each
    micro-batch (``micro_batch_rows`` rows, or packed) as the grouper runs it: the plans' prefix and suffix tokens."""
    cost = TrainCostModel(per_token_s=1.0, max_token_len=max_token_len, micro_batch_rows=micro_batch_rows,
                          shared_prefix=shared_prefix)
    return cost.pass_time(list(lengths), groups, prompts)


def _train_step(cfg: Any, engine: Any, loss_fn: Any, step: list, req: int, per_mb: int,
                grouper: bool) -> tuple[float, int, float, float, int, int]:
    """One trainer step's updates on ``step`` (``req`` groups): ``(seconds, tokens, priced tokens, priced tokens
    of the rows trained, rows, rows trained)``, priced with the prefix grouper's plans when ``grouper``. Scores,
    token rewards and advantages as
    :meth:`FullyAsyncTrainer.fit_step` computes them (bypass mode: the rollout's log-probs are the old ones; no
    critic or reference)."""
    from asyncrl.trainer.advantages import compute_advantages
    from asyncrl.trainer.engine import collate, rows_with_gradient
    from asyncrl.trainer.rewards import shaped_scores, token_level_rewards

    al = cfg.algorithm
    actor = cfg.actor_rollout_ref.actor
    budget = actor.ppo_max_token_len_per_gpu if actor.use_dynamic_bsz else None

    def price(b: Any) -> float:  # prompt tokens of a row: its first response token's column (none: its length)
        lengths = b.attention_mask.sum(-1).tolist()
        prompts = [f if f > 0 else n for f, n in zip(b.resp_index[:, 0].tolist(), lengths)]
        return priced_tokens(lengths, budget, b.group_ids, prompts, grouper, actor.ppo_micro_batch_size)

    t0, tokens, priced, trained, rows, kept, untimed = time.perf_counter(), 0, 0.0, 0.0, 0, 0, 0.0
    for m in range(0, req, per_mb):
        part = step[m:m + per_mb]
        batch = collate([o for g in part for o in g], [j for j, g in enumerate(part) for _ in g])
        scores = shaped_scores(batch.rewards, batch.response_lengths, cfg)
        token_rewards, _ = token_level_rewards(scores, batch.response_mask)
        advantages, returns = compute_advantages(al.adv_estimator, token_rewards, batch.response_mask,
                                                 batch.group_ids, al)
        batch.extras.update(old_log_probs=batch.rollout_log_probs, advantages=advantages, returns=returns)
        engine.update(batch, loss_fn)
        t1 = time.perf_counter()
        tokens += int(batch.attention_mask.sum())
        priced += price(batch)
        done = rows_with_gradient(batch) if getattr(engine, "skip_zero_advantage", False) else batch  # what update() trained
        trained += price(done)
        rows, kept = rows + len(batch), kept + len(done)
        untimed += time.perf_counter() - t1
    return time.perf_counter() - t0 - untimed, tokens, priced, trained, rows, kept
