"""The simulator on ``async_vs_colocate.py --gpu``: every GPU mode predicted with the H200 cost model.

::

    mode_config(mode, args with --gpus G)  the benchmark's own config of each mode (no weights built)
      -> asyncrl.sim.simulate(config, h200_qwen25_05b_hf(sync))   colocated: G GPUs shared, cuda_ipc sync
                                                                   async:     G/2 rollout + G/2 trainer, nccl
      -> rows: samples/s, per-step split (gen / fetch wait / update / sync), idle ratios, version lag

Used two ways (``benchmarks/RESULTS.md``, "GPU: the simulator on the measured H200 runs"):

* ``--gpu --simulate-only``: no GPU, no Ray. Predicts colocated on 1 GPU and on ``--gpus`` GPUs and every
  async mode of ``--modes`` on ``--gpus`` GPUs, and prints each async mode's ratio to colocated: what a user
  runs before spending GPU hours.
* ``--gpu`` (measured run, ``--simulate`` is on by default): after the measured modes, predicts each one on
  the run's own ``--gpus`` and steps, and ``report()`` prints the prediction beside the measurement.

The cost model's constants are measurements of the hf engine, the FSDP2 trainer and the syncs on H200s
(:func:`asyncrl.sim.presets.h200_qwen25_05b_hf` quotes each source); nothing here is fitted to the
runs being predicted except the trainer's update time (taken from the colocated run, as its docstring says).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any, Callable

SIMULATED_FROM = ("asyncrl.sim with the documented H200 cost model h200_qwen25_05b_hf: hf decode and prefill "
                  "from hf_rollout_cuda.py, FSDP2 update from the colocated runs, syncs from the GPU sections")
TRAINER_LAYOUT = "causal"
"""The FSDP2 engine's batch layout today (``h200_qwen25_05b_hf(trainer_layout=...)``), recorded in every ``--gpu``
result as ``trainer_layout``; a result without it was made before session 10, with the ``masked`` layout."""
ROLLOUT_SLOTS = "compact"
"""The hf engine's slot layout today (``h200_qwen25_05b_hf(rollout_slots=...)``), recorded in every ``--gpu`` result
as ``rollout_slots``; a result without it was made before session 26, when a step computed every slot up to the
highest busy one (``highest``)."""


def resources(mode: str, gpus: int) -> tuple[int, int, str]:
    """``(rollout GPUs, trainer GPUs, sync backend)`` of ``mode`` on ``gpus`` GPUs, as ``placement()`` lays
    the benchmark out: colocated shares every GPU (cuda_ipc), the async modes split them (nccl)."""
    if mode.startswith("colocated"):
        return gpus, gpus, "cuda_ipc"
    if gpus < 2:
        raise ValueError(f"mode {mode} splits the GPUs between rollout and trainer: it needs 2 or more, got {gpus}")
    return gpus // 2, gpus - gpus // 2, "nccl"


def predict(mode: str, gpus: int, steps: int, args: argparse.Namespace, mode_config: Callable[..., Any],
            trainer_layout: str = TRAINER_LAYOUT, rollout_slots: str = ROLLOUT_SLOTS) -> dict:
    """Simulate ``steps`` trainer steps of ``mode`` on ``gpus`` H200s with the benchmark's config of it
    (``trainer_layout``: the FSDP2 engine's, ``causal`` today, ``masked`` for runs before session 10;
    ``rollout_slots``: the hf engine's, ``compact`` today, ``highest`` for runs before session 26).

    Returns:
        One row: ``mode``, ``gpus``, ``samples_per_s`` (the whole run, the preset's ``H200_WARMUP_S`` of first-step
        warm-up added to the simulated wall), ``steady_samples_per_s`` (the steady window the benchmark measures
        its own steady rate over, no warm-up), ``no_warmup_samples_per_s``, ``response_length_per_step`` (mean response tokens of each step), ``step_s`` (mean after 2 steps of fill), the median
        ``gen_s`` / ``fetch_s`` / ``update_s`` / ``sync_s`` of a step over the steps the benchmark's
        ``step_split`` takes (all but the first ``min(2, steps - 3)``), idle ratios, ``lag_mean``.

    The simulated run draws its prompts from the measured run's data order: every ``train_size`` row is built
    (the order is a permutation of the row count, and the length workload draws per row index), so the
    simulated steps have the measured steps' response lengths (session 12: with the simulator's default 4,096
    rows the 4,096-token steps had other longest responses, and a step's generation is its longest).
    """
    from asyncrl.sim import simulate
    from asyncrl.sim.presets import H200_WARMUP_S, h200_qwen25_05b_hf

    rollout_gpus, train_gpus, sync = resources(mode, gpus)
    # the model's engine; simulate_only: the simulator prices the model by its cost model and loads no
    # weights, so the 494M random-init checkpoint is not built (it was 2 GB written per call)
    cfg = mode_config(mode, argparse.Namespace(**{**vars(args), "gpus": gpus, "backend": "hf", "simulate_only": True}))
    cfg.trainer.total_training_steps, cfg.trainer.total_time_s = steps, 0.0
    res = simulate(cfg, h200_qwen25_05b_hf(sync, trainer_layout, rollout_slots), rollout_gpus=rollout_gpus, train_gpus=train_gpus,
                   name=f"{mode}@{gpus}", max_rows=cfg.data.train_size)
    rows = res.history[min(2, max(0, len(res.history) - 3)):]  # run_mode's steady window

    def med(key: str) -> float:
        return statistics.median(r.get(key, 0.0) for r in rows) if rows else 0.0

    hist = res.history
    steady = hist[min(2, max(0, len(hist) - 3)):]  # run_mode's steady rate: the same window, the same formula
    span = steady[-1]["time_s"] - steady[0]["time_s"] if len(steady) > 1 else 0.0
    per_step = res.trained / len(hist) if hist else 0.0
    return {"mode": mode, "gpus": gpus, "samples_per_s": res.trained / (res.wall_s + H200_WARMUP_S) if hist else 0.0,
            "steady_samples_per_s": (len(steady) - 1) * per_step / span if span else res.samples_per_s,
            "no_warmup_samples_per_s": res.samples_per_s, "step_s": res.step_time(2),
            "response_length_per_step": [r.get("response_length/mean") for r in hist],
            "gen_s": med("timing/gen_s"), "fetch_s": med("timing/fetch_s"), "update_s": med("timing/update_s"),
            "sync_s": med("sync/total_s"), "trainer_idle_ratio": res.trainer_idle_ratio,
            "rollouter_idle_ratio": res.rollouter_idle_ratio, "lag_mean": res.summary()["lag_mean"]}


def simulate_measured(result: dict, args: argparse.Namespace, mode_config: Callable[..., Any]) -> dict:
    """Each measured mode of a ``--gpu`` run predicted on the run's ``--gpus`` for its measured steps, in the
    shape ``report()`` prints (``error`` against the whole run, ``steady_error`` against its steady state);
    ``{}`` for a vLLM run (the cost model is of the hf engine)."""
    if args.backend != "hf":
        print(f"not simulated: the H200 cost model is of the hf engine, this run used --backend {args.backend}")
        return {}
    out, layout, slots = {}, result.get("trainer_layout", "masked"), result.get("rollout_slots", "highest")
    for m, measured in result["modes"].items():
        row = predict(m, args.gpus, max(1, measured["steps"]), args, mode_config, layout, slots)
        got, steady = measured["samples_per_s"], measured.get("steady_samples_per_s")
        out[m] = {**row, "without_contention_samples_per_s": None,
                  "error": row["samples_per_s"] / got - 1 if got else None,
                  "steady_error": row["steady_samples_per_s"] / steady - 1 if steady else None}
    return out


def simulate_only(args: argparse.Namespace, modes: list[str], mode_config: Callable[..., Any]) -> dict:
    """Predict colocated (and each other colocated mode of ``modes``, e.g. ``colocated_dyn``) on 1 and ``--gpus``
    GPUs and each async mode of ``modes`` on ``--gpus`` GPUs; print
    the table and every async mode's ratio to colocated. Needs no GPU and no Ray.

    Returns:
        ``{"rows": [predict() rows], "ratios": {"d / colocated@2": x, ...}}``.

    Raises:
        SystemExit: an async mode asked for with ``--gpus`` < 2 (from the benchmark's ``placement``).
    """
    colocated = ["colocated"] + [m for m in modes if m.startswith("colocated") and m != "colocated"]
    setups = [(m, g) for m in colocated for g in sorted({1, args.gpus})]  # colocated_dyn too, when asked for
    setups += [(m, args.gpus) for m in modes if not m.startswith("colocated")]  # placement() refuses --gpus < 2
    rows = [predict(m, g, args.steps, args, mode_config) for m, g in setups]
    bases = {(r["mode"], r["gpus"]): r["samples_per_s"] for r in rows if r["mode"].startswith("colocated")}
    ratios = {f"{r['mode']} / {b}@{g}": r["samples_per_s"] / v  # each async mode against every colocated row
              for r in rows if not r["mode"].startswith("colocated") for (b, g), v in bases.items() if v}
    ratios.update({f"{b}@{g} / colocated@{g}": v / bases["colocated", g]  # colocated_dyn ... against plain
                   for (b, g), v in bases.items() if b != "colocated" and bases.get(("colocated", g))})
    print_predictions(rows, ratios, args)
    return {"rows": rows, "ratios": ratios}


def print_predictions(rows: list[dict], ratios: dict, args: argparse.Namespace) -> None:
    """The predicted table (one row per mode and GPU count) and the ratios."""
    print(f"predicted on H200s ({SIMULATED_FROM}); {args.steps} steps, responses lognormal median "
          f"{args.gpu_median_tokens}, max {args.gpu_max_tokens} tokens:")
    w = max([10] + [len(r["mode"]) for r in rows])
    print(f"{'mode':{w}s}  GPUs  samples/s  step s   gen s  fetch wait s  update s  sync s  trainer idle  rollouter idle   lag")
    for r in rows:
        print(f"{r['mode']:{w}s} {r['gpus']:5d} {r['samples_per_s']:10.3f} {r['step_s']:7.2f} {r['gen_s']:7.2f} "
              f"{r['fetch_s']:13.2f} {r['update_s']:9.2f} {r['sync_s']:7.3f} {r['trainer_idle_ratio']:13.2f} "
              f"{r['rollouter_idle_ratio']:15.2f} {r['lag_mean']:5.2f}")
    for k, v in ratios.items():
        print(f"predicted {k}: {v:.2f}x")
