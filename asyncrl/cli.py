"""``asyncrl`` command line: ``asyncrl train [config.yaml] [key=value ...]`` and ``asyncrl demo``.

Overrides use verl's key names (``async_training.staleness_threshold=0.5``); a few short aliases
are accepted (``task=arith`` -> ``data.task=arith``). An unknown key exits with status 2 and names
the closest valid key.
"""

from __future__ import annotations

import argparse
import logging
import sys

ALIASES = {
    "task": "data.task",
    "steps": "trainer.total_training_steps",
    "seed": "trainer.seed",
    "agent": "actor_rollout_ref.rollout.agent.sandbox.agent",  # bash | oracle | harbor:<name>
}


def _expand(overrides: list[str]) -> list[str]:
    out = []
    for item in overrides:
        key, sep, value = item.partition("=")
        out.append(f"{ALIASES.get(key, key)}{sep}{value}")
    return out


def _train(args: argparse.Namespace) -> int:
    from asyncrl.config import ConfigError, load_config
    from asyncrl.experiment import Experiment
    from asyncrl.recipes import RECIPES, TASK_RECIPES

    yaml_path = None
    overrides = list(args.overrides)
    if overrides and "=" not in overrides[0]:
        yaml_path = overrides.pop(0)
    task = next((o.partition("=")[2] for o in overrides if o.partition("=")[0] in ("task", "data.task")), None)
    recipe = args.recipe or ("arith_grpo_cpu" if task is None else None)
    if recipe is None and task not in TASK_RECIPES:
        recipe = "arith_grpo_cpu"  # a dataset task without its own recipe
    base = RECIPES.get(recipe) if recipe else TASK_RECIPES[task]
    if base is None:
        print(f"unknown recipe {recipe!r}; known: {sorted(RECIPES)}", file=sys.stderr)
        return 2
    try:
        cfg = load_config(yaml_path, _expand(overrides), base=base())
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    summary = Experiment(cfg).run()
    print(summary)
    print(f"artifacts: {summary.run_dir}/ (metrics.csv, eval.csv, plot.png, config.yaml, summary.json)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asyncrl", description="Fully asynchronous RL for LLMs")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_ in [("train", "run fully async training"), ("demo", "train the embedded model on arith")]:
        p = sub.add_parser(name, help=help_)
        p.add_argument("overrides", nargs="*", help="[config.yaml] key=value ... (verl key names)")
        p.add_argument("--recipe", default=None,
                       help="base recipe (default: the task's recipe, e.g. task=calc_tool -> calc_tool_grpo_cpu; "
                            "else arith_grpo_cpu)")
        p.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.WARNING),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return _train(args)


if __name__ == "__main__":
    sys.exit(main())
