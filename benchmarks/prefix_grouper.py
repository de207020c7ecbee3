"""The CPU trainer's update with ``actor.use_prefix_grouper`` off and on, side by side in one run.

Builds the trainer's own engine (:func:`asyncrl.trainer.factory.build_cpu_train_engine`) twice from the same
config, one with the key off and one on, and times ``TrainEngine.update`` on the same GRPO mini-batches
(``--groups`` prompt groups x ``--n`` responses, prompts of ``--prompt`` tokens, responses drawn uniformly from
``--response`` lo-hi tokens), alternating off/on per repeat so the box's drift falls on both. Prints the median
seconds per update of each, their ratio, and the tokens each ran through the model (``perf/tokens``).

``--sim-check``: the simulator's trainer price beside the engine (:mod:`asyncrl.sim.prefix_pricing`). One
:class:`~asyncrl.sim.cost_models.TrainCostModel` price per token, fitted on one workload (the ``--n``,
``--prompt``, ``--response`` mini-batch) as ``asyncrl.sim.calibrate.measure_train`` fits it (measured seconds /
priced tokens), predicts the measured update of the others (rollout.n 2, 4, 16 and a prompt twice as long,
``--groups`` groups each), key off and on (each from its own price, and off from the key-on price too); printed
as measured, predicted and their ratio.

Usage::

    python benchmarks/prefix_grouper.py                                   # the arith demo's shapes, 1 thread
    python benchmarks/prefix_grouper.py --threads 2
    python benchmarks/prefix_grouper.py --model smollm2-135m-instruct --prompt 120 --response 40-160 --groups 2
    python benchmarks/prefix_grouper.py --sim-check --json sim_check.json  # the simulator's price beside the engine
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def mini_batch(groups: int, n: int, prompt: int, response: tuple[int, int], vocab: int, seed: int):
    """A collated GRPO mini-batch with advantages (half the rows +1, half -1 per group) and old log-probs."""
    from asyncrl.agent_loop.base import AgentLoopOutput
    from asyncrl.trainer.engine import collate

    rng = random.Random(seed)
    outs, gids = [], []
    for g in range(groups):
        p = [rng.randrange(3, vocab) for _ in range(prompt)]
        for k in range(n):
            r = rng.randint(*response)
            outs.append(AgentLoopOutput(p, [rng.randrange(3, vocab) for _ in range(r)], [1] * r, [-1.0] * r,
                                        float(k % 2), response_versions=[0] * r))
            gids.append(f"uid-{seed}-{g}")
    b = collate(outs, gids)
    b.extras["advantages"] = (b.rewards * 2 - 1)[:, None] * b.response_mask
    b.extras["old_log_probs"] = b.rollout_log_probs.clone()
    return b


def time_pairs(engines: dict, loss_fn, batches: list) -> tuple[dict, dict]:
    """Seconds of ``engines[on].update`` per batch, off/on alternated per pair (the first pair warms up, untimed):
    ``({on: [s]}, {on: perf/tokens of the last batch})``."""
    times: dict[str, list[float]] = {"false": [], "true": []}
    tokens: dict[str, float] = {}
    for rep, batch in enumerate(batches):
        for on in (("false", "true") if rep % 2 == 0 else ("true", "false")):
            t0 = time.perf_counter()
            out = engines[on].update(batch, loss_fn)
            if rep:
                times[on].append(time.perf_counter() - t0)
                tokens[on] = out["perf/tokens"]
    return times, tokens


SIM_CHECK = {"fit": (None, 1), "n=2": (2, 1), "n=4": (4, 1), "n=16": (16, 1), "prompt x2": (None, 2)}
"""``--sim-check`` workloads: name -> (rollout.n, None for ``--n``; prompt tokens as a multiple of ``--prompt``)."""


def priced(batch, on: bool, micro: int) -> float:
    """Tokens the simulator prices ``batch``'s update at (``asyncrl.sim.calibrate.priced_tokens``: prompt lengths from
    the first response column), with or without the grouper's plans over micro-batches of ``micro`` rows."""
    from asyncrl.sim.calibrate import priced_tokens

    lengths = batch.attention_mask.sum(-1).tolist()
    prompts = [f if f > 0 else n for f, n in zip(batch.resp_index[:, 0].tolist(), lengths)]
    return priced_tokens(lengths, None, batch.group_ids, prompts, on, micro)


def sim_check(args, engines: dict, loss_fn, vocab: int, span: tuple[int, int]) -> dict:
    """Measure every :data:`SIM_CHECK` workload off and on (round-robin over the workloads each repeat, so the box's
    drift falls on all of them; off/on alternated per pair; the first round warms up), then price each from the
    ``fit`` workload's price per priced token with the key as set (what ``measure_train`` gives the simulator for that
    config). ``off, on-price``: the plain updates priced with the key-on price, as a simulation of a config with the
    key off would price them from a calibration measured with it on. ``us/model token``: measured seconds over the
    tokens the engine ran (``perf/tokens``: padding included), to tell padding from other misses."""
    shapes = {name: (n or args.n, args.prompt * k) for name, (n, k) in SIM_CHECK.items()}
    batches = {name: [mini_batch(args.groups, n, prompt, span, vocab, seed=rep) for rep in range(args.repeats + 1)]
               for name, (n, prompt) in shapes.items()}
    times = {name: {"false": [], "true": []} for name in shapes}
    model_tokens = {name: {"false": [], "true": []} for name in shapes}
    for rep in range(args.repeats + 1):
        for name in shapes:
            for on in (("false", "true") if rep % 2 == 0 else ("true", "false")):
                t0 = time.perf_counter()
                out = engines[on].update(batches[name][rep], loss_fn)
                if rep:
                    times[name][on].append(time.perf_counter() - t0)
                    model_tokens[name][on].append(out["perf/tokens"])
    rows: dict[str, dict] = {}
    for name, (n, prompt) in shapes.items():
        r = rows[name] = {"n": n, "prompt": prompt, "rows": args.groups * n, "times": times[name]}
        for on in ("false", "true"):
            r[f"{on}_s"] = statistics.median(times[name][on])
            r[f"{on}_priced"] = statistics.fmean(priced(b, on == "true", args.micro) for b in batches[name][1:])
            r[f"{on}_model_tokens"] = statistics.fmean(model_tokens[name][on])
    price = {on: rows["fit"][f"{on}_s"] / rows["fit"][f"{on}_priced"] for on in ("false", "true")}
    print(f"TrainCostModel price per priced token, fitted on {args.groups} groups x {args.n}, prompt {args.prompt}: "
          f"off {price['false'] * 1e6:.2f} us, on {price['true'] * 1e6:.2f} us; {args.threads} thread(s), "
          f"{args.repeats} rounds; seconds an update (median):")
    print(f"  {'workload':<10} {'rows':>5}  {'off: measured':>13} {'predicted':>9} {'ratio':>6}  "
          f"{'on: measured':>12} {'predicted':>9} {'ratio':>6}  {'off, on-price':>13}  us/model token off, on")
    for name, r in rows.items():
        for on in ("false", "true"):
            r[f"{on}_predicted_s"] = price[on] * r[f"{on}_priced"]
            r[f"{on}_ratio"] = r[f"{on}_predicted_s"] / r[f"{on}_s"]
        r["false_ratio_on_price"] = price["true"] * r["false_priced"] / r["false_s"]
        print(f"  {name:<10} {r['rows']:>5}  {r['false_s']:>13.3f} {r['false_predicted_s']:>9.3f} "
              f"{r['false_ratio']:>6.2f}  {r['true_s']:>12.3f} {r['true_predicted_s']:>9.3f} {r['true_ratio']:>6.2f}  "
              f"{r['false_ratio_on_price']:>13.2f}  {r['false_s'] / r['false_model_tokens'] * 1e6:>6.1f} "
              f"{r['true_s'] / r['true_model_tokens'] * 1e6:>6.1f}")
    return {"price_s_per_priced_token": price, "workloads": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model dir or fetchable name (default: the embedded arith model)")
    ap.add_argument("--groups", type=int, default=16, help="prompt groups per mini-batch (the demo: 16)")
    ap.add_argument("--n", type=int, default=8, help="responses per group (rollout.n)")
    ap.add_argument("--prompt", type=int, default=33, help="prompt tokens (the arith demo's chat prompt: ~33)")
    ap.add_argument("--response", default="12-24", help="response tokens lo-hi (the arith demo: 12-24)")
    ap.add_argument("--micro", type=int, default=64, help="ppo_micro_batch_size (rows)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the async trainer's default: 1)")
    ap.add_argument("--repeats", type=int, default=6, help="off/on pairs timed")
    ap.add_argument("--set", nargs="*", default=[], help="extra config overrides (key=value)")
    ap.add_argument("--sim-check", action="store_true", help="the simulator's price beside the engine (docstring)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from asyncrl.config import load_config
    from asyncrl.trainer.factory import build_cpu_train_engine
    from asyncrl.trainer.update import actor_loss_fn

    torch.set_num_threads(args.threads)
    model = args.model
    if model and not os.path.isdir(model):
        from asyncrl.models.fetch import fetch_model

        model = str(fetch_model(model))
    base = [f"actor_rollout_ref.actor.ppo_micro_batch_size={args.micro}", *args.set]
    if model:
        base.append(f"actor_rollout_ref.model.path={model}")
    engines = {on: build_cpu_train_engine(load_config(overrides=[*base, f"actor_rollout_ref.actor.use_prefix_grouper={on}"]))
               for on in ("false", "true")}
    cfg = load_config(overrides=base)
    loss_fn = actor_loss_fn(cfg)
    vocab = engines["false"].model.config.vocab_size
    lo, hi = (int(x) for x in args.response.split("-"))
    if args.sim_check:
        result = sim_check(args, engines, loss_fn, vocab, (lo, hi))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"model": model or cfg.actor_rollout_ref.model.path, "threads": args.threads,
                           "response": args.response, "micro": args.micro, **result}, f, indent=1)
        return
    batches = [mini_batch(args.groups, args.n, args.prompt, (lo, hi), vocab, seed=rep) for rep in range(args.repeats + 1)]
    times, tokens = time_pairs(engines, loss_fn, batches)
    off, on = statistics.median(times["false"]), statistics.median(times["true"])
    result = {"model": model or cfg.actor_rollout_ref.model.path, "rows": args.groups * args.n, "threads": args.threads,
              "prompt": args.prompt, "response": args.response, "off_s": off, "on_s": on, "speedup": off / on,
              "tokens_off": tokens["false"], "tokens_on": tokens["true"], "times": times}
    print(f"{result['rows']} rows ({args.groups} groups x {args.n}), prompt {args.prompt}, response {args.response}, "
          f"{args.threads} thread(s), {args.repeats} pairs:")
    print(f"  use_prefix_grouper=false  {off:.3f} s an update  {tokens['false']:.0f} tokens")
    print(f"  use_prefix_grouper=true   {on:.3f} s an update  {tokens['true']:.0f} tokens")
    print(f"  speedup {off / on:.2f}x (tokens {tokens['false'] / tokens['true']:.2f}x fewer)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
