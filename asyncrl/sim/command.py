"""``asyncrl sim``: simulate a config (or verl's published 7B experiment) from the command line.

    asyncrl sim task=longtail                                   # the recipe on the CPU cost model
    asyncrl sim --recipe longtail_colocated_cpu --preset cpu-embedded-vllm --cores 2
    asyncrl sim --preset h20-qwen2.5-7b --rollout-gpus 64 --train-gpus 64 --token-scale 64 [config.yaml] [k=v ...]
    asyncrl sim --seed-7b                                       # colocated 128 H20 vs async 64:64 (~15-35 s)
    asyncrl sim --preset h200-qwen2.5-0.5b-hf --rollout-gpus 1 --train-gpus 1 [k=v ...]  # hf engine + FSDP2 on H200s
    asyncrl sim task=longtail --contention 0.3                  # both sides 30% slower while they overlap
"""

from __future__ import annotations

import argparse
import math
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim", help="simulate a run in virtual time (asyncrl.sim) and print its throughput")
    p.add_argument("overrides", nargs="*", help="[config.yaml] key=value ... (verl key names)")
    p.add_argument("--recipe", default=None, help="base recipe (default: the task's, else arith_grpo_cpu)")
    p.add_argument("--preset", default=None,
                   help="cost model: cpu-embedded-vllm (the default) | h20-qwen2.5-7b | h100-qwen2.5-7b | "
                        "h200-qwen2.5-0.5b-hf")
    p.add_argument("--cores", type=int, default=None,
                   help="cpu-embedded-vllm only: the cores of one resource unit (rollout_gpus / train_gpus count "
                        "units): 1 (the default) prices the 2-core box split a core per side, as the async modes "
                        "run it; 2 prices both phases on both cores, as the colocated mode runs it (with an async "
                        "config, 2 means two cores for each side)")
    p.add_argument("--rollout-gpus", type=int, default=None,
                   help="GPUs of the rollout replicas, whole replicas of the preset (h20 / h100: TP 4, so a multiple "
                        "of 4; cpu-embedded-vllm: units of --cores cores). Default: the config's rollout.nnodes x "
                        "rollout.n_gpus_per_node (verl's fully-async keys: GPUs for rollout) when set, else "
                        "actor_rollout_ref.rollout.num_replicas x the preset's GPUs per replica (h20 / h100: 1 x 4). "
                        "Colocated (hybrid_engine): the one pool both phases take turns on (trainer.nnodes x "
                        "trainer.n_gpus_per_node when set), equal to --train-gpus. A value the config's keys "
                        "contradict is refused")
    p.add_argument("--train-gpus", type=int, default=None,
                   help="GPUs of the trainer, whole ranks of the preset (h20 / h100: Ulysses SP 4). Default: the "
                        "config's trainer.nnodes x trainer.n_gpus_per_node (with actor_rollout_ref.actor.strategy="
                        "fsdp2) when set, else the preset's trainer (h20 / h100: 16 ranks x 4 = 64 GPUs; "
                        "cpu-embedded-vllm: 1 unit); colocated: the larger of the two defaults")
    p.add_argument("--token-scale", type=int, default=1,
                   help="real tokens per simulated token (64 for 28K responses); the config's rollout.response_length "
                        "and data.length_workload.median are then in simulated tokens (real tokens / token scale), as "
                        "asyncrl.sim.scenarios.verl_dapo_7b sets them, and the cost model prices each simulated token "
                        "as that many real ones")
    p.add_argument("--contention", type=float, default=None,
                   help="the cost model's contention term for both sides (asyncrl.sim.cost_models, Contention): "
                        "decode and training stretched by 1 + C while they overlap, e.g. as async_vs_colocate.py "
                        "calibrated it on this machine; colocated runs ignore it")
    p.add_argument("--seed-7b", action="store_true", help="reproduce verl's published fully-async 7B experiment instead (Qwen2.5-7B, DAPO, H20s: colocated on 128 GPUs vs 64 rollout + 64 trainer; verl docs, 'Recipe: Fully Async Policy Trainer')")
    p.add_argument("--log-level", default="WARNING")


def run(args: argparse.Namespace, load: "callable") -> int:
    """Run ``asyncrl sim``; ``load(args)`` returns the config (or an exit status) like ``asyncrl train``.

    Raises:
        asyncrl.failures.RolloutStopped: the rollouter stopped the simulated run (every sample failed, e.g. a broken
            reward); the CLI prints it as ``sim error: ...`` and exits 2 (:func:`asyncrl.cli.main`).
    """
    import pandas as pd

    from asyncrl.config import ConfigError
    from asyncrl.sim.presets import PRESETS, cpu_embedded_vllm

    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 30)

    def user_error(message: str) -> int:  # the CLI's one error style
        print(f"config error: {message}", file=sys.stderr)
        return 2

    if args.seed_7b:
        given = ([" ".join(args.overrides)] if args.overrides else []) + [
            f"--{k.replace('_', '-')} {v}" for k, v in (("recipe", args.recipe), ("preset", args.preset),
                                                       ("cores", args.cores), ("rollout_gpus", args.rollout_gpus),
                                                       ("train_gpus", args.train_gpus), ("contention", args.contention))
            if v is not None] + ([f"--token-scale {args.token_scale}"] if args.token_scale != 1 else [])
        if given:
            return user_error("--seed-7b runs verl's fixed 7B experiment (its own presets, GPUs and token scale) "
                              f"and takes no config, recipe, overrides or cost-model options (got {', '.join(given)}); "
                              "drop them, or drop --seed-7b")
        from asyncrl.sim.scenarios import SEED_RATIO, reproduce_seed

        rep = reproduce_seed()
        print("(Qwen2.5-7B on H20s, DAPO, 512 prompts x 16 responses a step, up to 28K-token responses: colocated 128 "
              "= verl's colocated run on 128 GPUs; async 64:64 = fully async, 64 rollout + 64 trainer GPUs. Simulated "
              "seconds per 512 prompts (one colocated step; four async steps, one sync); async generation_s is NaN: it overlaps the update, what "
              "the trainer waits is trainer_wait_s; verl_* = verl's measured step and update_actor)")
        print(rep.breakdown().round(1).to_string(index=False))
        lo, hi = SEED_RATIO
        where = ("within verl's range" if lo <= rep.ratio <= hi else
                 f"{'below' if rep.ratio < lo else 'above'} verl's range, "
                 + ("within" if 0.85 * lo <= rep.ratio <= 1.15 * hi else "outside") + " its 15%")
        print(f"simulated speed-up {rep.ratio:.2f}x (colocated step_s / async step_s; verl measured {lo}-{hi}x): {where}")
        return 0
    args.preset = args.preset or "cpu-embedded-vllm"
    if args.preset not in PRESETS:  # the registries' message, the suggestion also for another case (H20)
        from asyncrl.registry import UnknownNameError

        return user_error(str(UnknownNameError("sim preset (--preset)", args.preset, sorted(PRESETS))))
    if args.cores is not None and args.preset != "cpu-embedded-vllm":
        return user_error(f"--cores applies to the cpu-embedded-vllm preset only; {args.preset} counts GPUs: "
                          "use --rollout-gpus / --train-gpus")
    for item in args.overrides:  # the split and the cost model are options, not config keys
        key, _, value = item.partition("=")
        if key in FLAG_KEYS:
            unit = (" (a whole number of units of --cores cores)" if args.preset == "cpu-embedded-vllm" and
                    key.endswith("gpus") else "")
            return user_error(f"{item} is not a config key: use --{key.replace('_', '-')} {value}{unit}")
    cfg = load(args)
    if isinstance(cfg, int):
        return cfg
    from asyncrl.data.dataset import run_rows
    from asyncrl.reward import source_check
    from asyncrl.sim import simulate
    from asyncrl.staleness import in_flight_warning

    if args.contention is not None and not (math.isfinite(args.contention) and args.contention >= 0):
        return user_error(f"--contention must be a finite number >= 0 (a fractional slowdown), got {args.contention}")
    cores = 1 if args.cores is None else args.cores
    try:
        cost = cpu_embedded_vllm(cores) if args.preset == "cpu-embedded-vllm" else PRESETS[args.preset]()
    except ConfigError as exc:
        return user_error(str(exc))
    if args.contention is not None:
        from dataclasses import replace

        cost = replace(cost, rollout=replace(cost.rollout, contention=args.contention),
                       train=replace(cost.train, contention=args.contention))
    try:
        r_gpus, t_gpus, keyed = gpu_split(cfg, cost, args.rollout_gpus, args.train_gpus)
    except ConfigError as exc:
        return user_error(str(exc))
    if args.token_scale < 1:  # before the notes below, which would explain a price the run then refuses
        return user_error(f"--token-scale is real tokens per simulated token, at least 1; got {args.token_scale}")
    if args.preset != "cpu-embedded-vllm" and r_gpus is None and t_gpus is None and not cfg.actor_rollout_ref.hybrid_engine:
        r_def = cfg.actor_rollout_ref.rollout.num_replicas * cost.rollout.gpus
        t_def = cost.train.n_ranks * cost.train.gpus_per_rank
        print(f"note: no rollout:trainer split given: {args.preset}'s default, {r_def} rollout GPUs (rollout.num_replicas="
              f"{cfg.actor_rollout_ref.rollout.num_replicas} x {cost.rollout.gpus} a replica) against {t_def} trainer GPUs (the "
              "preset's trainer); give --rollout-gpus / --train-gpus")
    if args.preset != "cpu-embedded-vllm" and cfg.data.length_workload.distribution == "none":
        print(f"note: {args.preset} prices a large model's tokens, and this config's responses are its task's own "
              f"({cfg.data.task}, up to {cfg.actor_rollout_ref.rollout.response_length} tokens); a GPU-scale workload "
              "is data.length_workload (e.g. distribution=lognormal median=450), as --seed-7b sets it")
    if args.preset == "cpu-embedded-vllm" and cfg.actor_rollout_ref.hybrid_engine and cores == 1:
        print("note: a colocated run on cpu-embedded-vllm with --cores 1 (the default) is priced on one core, half the "
              "2-core box the async modes split a core per side; add --cores 2 for the colocated baseline")
    if args.preset == "cpu-embedded-vllm" and args.token_scale != 1:
        print(f"note: --token-scale {args.token_scale} prices each simulated token as {args.token_scale} real ones on "
              "the embedded model's CPU cost model: it is meant for the GPU presets' long responses "
              "(data.length_workload), not for this task's")
    check = source_check(cfg, register_hint=False)  # a command line cannot asyncrl.reward.register_reward: not offered
    if check is not None:  # simulate() checks the rows again, as a Python caller's (who can) are checked
        for split in ("train", "test"):
            run_rows(cfg.data, split, cfg.trainer.seed, limit=1, check_source=check)
    res = simulate(cfg, cost, rollout_gpus=r_gpus, train_gpus=t_gpus, token_scale=args.token_scale)
    crowd = in_flight_warning(res.config)  # as simulated: the replicas of --rollout-gpus, the preset's seats
    if crowd:
        print(f"note: {crowd}")
    row = res.summary()  # its partial_rollout columns read "-" where they do not apply (colocated, off)
    units = (f"units of {cores} core(s) (--cores)" if args.preset == "cpu-embedded-vllm" else "GPUs")
    print(f"{row['run']}: {row['samples_per_s']:.3f} samples/s, {row['steps']} steps in {row['wall_s']:.1f} simulated s "
          f"({row['step_s']:.2f} s a step{' after the first' if row['steps'] > 1 else ''}); trainer idle {row['trainer_idle_ratio']:.2f}, rollouter idle "
          f"{row['rollouter_idle_ratio']:.2f}; lag mean {row['lag_mean']:.2f}, max {row['lag_max']}; "
          f"{row['gpus']} {f'unit(s) of {cores} core(s)' if args.preset == 'cpu-embedded-vllm' else 'GPU(s)'} in all")
    print(f"(run: s = async_training.staleness_threshold, t = trigger_parameter_sync_step, p = partial_rollout; "
          f"rollout_gpus / train_gpus count {units}{keyed}, gpus in all (colocated: one pool); the *_s columns are "
          "simulated seconds)")
    print(pd.DataFrame([row]).round(3).to_string(index=False))
    for line in (stale_summary(res), too_long_summary(res), failed_summary(res)):
        if line:
            print(line)
    return 0


FLAG_KEYS = ("rollout_gpus", "train_gpus", "token_scale", "cores", "contention", "preset", "recipe")
"""``asyncrl sim`` options a user may write as ``key=value`` (they are refused with the option to use)."""


def gpu_split(cfg, cost, rollout_gpus, train_gpus) -> tuple:
    """``(rollout_gpus, train_gpus, note)`` of ``asyncrl sim``: the options, else the config's GPU keys as verl's
    fully-async recipe means them (``rollout.nnodes x rollout.n_gpus_per_node`` GPUs for rollout, ``trainer.nnodes
    x trainer.n_gpus_per_node`` for training; colocated: the trainer's, one pool), else ``None`` (simulate()'s
    defaults); ``note`` says where they came from, for the legend. A real run places one replica per rollout GPU;
    the simulated replicas are the cost model's (TP 4 on h20): the config's GPU keys are set to the simulated
    layout so that its checks (one replica per rollout GPU) hold.

    Raises:
        asyncrl.config.ConfigError: an option the config's GPU keys contradict.
    """
    from asyncrl.config import ConfigError
    from asyncrl.placement import rollout_gpus as keyed_rollout, trainer_gpus as keyed_train

    hybrid = cfg.actor_rollout_ref.hybrid_engine
    t_keys = "trainer.nnodes x trainer.n_gpus_per_node"
    r_keys = f"{t_keys} (colocated: one pool)" if hybrid else "rollout.nnodes x rollout.n_gpus_per_node"
    keyed = {"rollout": keyed_rollout(cfg), "train": keyed_train(cfg)}
    given = {"rollout": rollout_gpus, "train": train_gpus}
    for side, keys in (("rollout", r_keys), ("train", t_keys)):
        if given[side] is not None and keyed[side] and given[side] != keyed[side]:
            raise ConfigError(f"--{side}-gpus {given[side]} contradicts the config's {keys} = {keyed[side]} GPUs for "
                              f"{side if side == 'rollout' else 'training'}; give one of them, or the same number")
    if not (keyed["rollout"] or keyed["train"]):
        return rollout_gpus, train_gpus, ""
    r = rollout_gpus or keyed["rollout"] or None
    t = train_gpus or keyed["train"] or None
    if hybrid:
        r = t = r or t
    if r and r % cost.rollout.gpus == 0:  # the simulated replicas, one per "rollout GPU" for the config's checks
        replicas = r // cost.rollout.gpus
        if hybrid:
            cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node = 1, replicas
        else:
            cfg.rollout.nnodes, cfg.rollout.n_gpus_per_node = 1, replicas
        cfg.actor_rollout_ref.rollout.num_replicas = replicas
    used = [t_keys + ": the colocated pool"] if hybrid else [k for k, side in ((r_keys, "rollout"), (t_keys, "train"))
                                                              if keyed[side] and not given[side]]
    return r, t, f" (from the config's {' and '.join(used)})" if used else ""


def stale_summary(res) -> str:
    """What the staleness bound cost a simulated run, as a real run's summary says it (:func:`asyncrl.summary.stale_line`:
    the responses of the groups the trainer dropped, in simulated tokens = real tokens / ``--token-scale``), plus the
    groups ended in generation (``async_training.drop_stale_in_generation``), which the ``dropped_stale`` column also
    counts; ``""`` when nothing was dropped."""
    from asyncrl.staleness import sample_budget
    from asyncrl.summary import stale_line

    dropped = res.accounting.get("dropped", {})
    line = stale_line(res.stale_length_counts, res.response_length_counts, dropped.get("stale_at_trainer"),
                      sample_budget(res.config).staleness_bound)
    in_gen = dropped.get("stale_in_generation", 0)
    if in_gen:  # their responses never reach the trainer, so their lengths are not counted
        line = (line + "; " if line else "") + (f"{in_gen} prompt group(s) ended in generation as stale "
                                                "(async_training.drop_stale_in_generation)")
    return line


def failed_summary(res) -> str:
    """How many prompts failed in the simulated run and why (a reward raising on some rows: the run goes on, session
    31's fresh user saw no word of it), as a real run's summary says it; ``""`` for none."""
    failed = res.accounting.get("failed", {})
    if not failed:
        return ""
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(failed.items(), key=lambda kv: -kv[1]))
    return (f"{sum(failed.values())} prompt(s) failed, not trained (by reason: {kinds}; the first of each kind is "
            "logged with its traceback)")


def too_long_summary(res) -> str:
    """How many prompts the rollouter skipped as longer than ``data.max_prompt_length`` (never generated, not
    trained; the count is of draws, so a prompt skipped again in a later epoch counts again); ``""`` for none."""
    n = res.accounting.get("dropped", {}).get("prompt_too_long", 0)
    if not n:
        return ""
    return (f"{n} prompt(s) skipped as longer than data.max_prompt_length={res.config.data.max_prompt_length} tokens "
            "(counted each time drawn, over epochs; not generated; raise data.max_prompt_length to keep them)")
