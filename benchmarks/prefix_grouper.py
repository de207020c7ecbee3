"""The CPU trainer's update with ``actor.use_prefix_grouper`` off and on, side by side in one run.

Builds the trainer's own engine (:func:`asyncrl.trainer.factory.build_cpu_train_engine`) twice from the same
config, one with the key off and one on, and times ``TrainEngine.update`` on the same GRPO mini-batches
(``--groups`` prompt groups x ``--n`` responses, prompts of ``--prompt`` tokens, responses drawn uniformly from
``--response`` lo-hi tokens), alternating off/on per repeat so the box's drift falls on both. Prints the median
seconds per update of each, their ratio, and the tokens each ran through the model (``perf/tokens``).

Usage::

    python benchmarks/prefix_grouper.py                                   # the arith demo's shapes, 1 thread
    python benchmarks/prefix_grouper.py --threads 2
    python benchmarks/prefix_grouper.py --model smollm2-135m-instruct --prompt 120 --response 40-160 --groups 2
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
    times: dict[str, list[float]] = {"false": [], "true": []}
    tokens: dict[str, float] = {}
    for rep in range(args.repeats + 1):  # the first pair warms up
        batch = mini_batch(args.groups, args.n, args.prompt, (lo, hi), vocab, seed=rep)
        for on in (("false", "true") if rep % 2 == 0 else ("true", "false")):
            t0 = time.perf_counter()
            out = engines[on].update(batch, loss_fn)
            if rep:
                times[on].append(time.perf_counter() - t0)
                tokens[on] = out["perf/tokens"]
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
