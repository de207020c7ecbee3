"""Metric namespace and run artifacts (table, plot, resolved config, summary).

Glossary (one row per trainer step in ``metrics.csv``, appended and flushed as the step ends by
:class:`asyncrl.tracking.Tracking`; seconds unless said otherwise):

==================================  =========================================================
``reward/mean``                     mean rule reward of the step's responses (0..1)
``response_length/mean``            mean model tokens per response
``staleness/lag_mean``, ``_max``    trainer param version minus the version that generated each
                                    trained token (0 = on-policy)
``staleness/update_lag_mean``, ...  the same lag in optimizer updates (differs when a sync carries several
                                    updates, mode b; includes PPO's mini-batch lag within a step)
``trainer/idle_ratio``              share of wall time the trainer waited for samples, cumulative from its start to this step
``rollouter/idle_ratio``            share of wall time with no prompt group in generation (replicas idle), cumulative
                                    from the rollouter's start to this step
``rollouter/partial_count``         samples in the step whose tokens span several versions
``rollouter/partial_max_span``      largest version span of one sample in the step
``rollouter/processing_p50_s`` ...  per-sample generation+reward time percentiles
``rollouter/queue_size``            MessageQueue size once the step's batch was fetched
``rollout/engine_busy_ratio``       share of the wall time between the previous step's fetch and this one's (the
                                    window of every ``rollout/engine_*``) the replicas' engines spent in
                                    model steps (mean over replicas; low: the engines were underfed)
``rollout/engine_batch_mean``       sequences per engine iteration (prefill + decode) in the window
``rollout/engine_decode_ms``        mean milliseconds of a decode-only engine iteration (higher than the same batch
                                    alone: the engine was slowed, e.g. its cores shared)
``rollout/engine_tokens_per_s``     tokens the engines generated per wall second in the window (all
                                    replicas; also evaluation's and tokens later aborted, partial or dropped)
``rollout/engine_generated_tokens`` those tokens' count: over a run, against the trained tokens, what generation
                                    cost beyond what trained (dropped groups, evaluation, look-ahead left at the end)
``rollout/engine_iterations``       engine iterations in the window (all replicas; fractional in a simulation, which
                                    prices spans of iterations). ``rollout/engine_*``: :mod:`asyncrl.rollout.engine_stats`;
                                    the first window opens when the rollouter starts; off with ``rollout.disable_log_stats``
``rollouter/dropped_stale_in_generation`` prompt groups dropped so far because they outlived the staleness bound
                                    before they finished (``async_training.drop_stale_in_generation``)
``actor/pg_loss``, ``pg_clipfrac``  PPO-clip loss and clipped fraction (``pg_clipfrac_lower``: dual clip)
``actor/ppo_kl``, ``actor/kl_loss`` behaviour-vs-policy KL estimate; reference KL (if enabled)
``actor/entropy``                   entropy of the filtered sampling distribution (``entropy_coeff`` > 0)
``actor/grad_norm``, ``actor/lr``   gradient norm before clipping; learning rate
``actor/reward_kl_penalty[_coeff]`` KL(old || ref) in the reward and its coefficient (``use_kl_in_reward``)
``critic/score_mean``               mean shaped score (rule reward + overlong penalty)
``critic/advantages_*``             mean and mean absolute advantage over trained tokens
``critic/returns_mean``             mean return (the critic's target for ``gae``)
``critic/vf_loss``, ``vf_clipfrac`` clipped value loss and its clipped fraction (``gae``)
``critic/grad_norm``, ``critic/lr`` the critic's optimizer (``gae``)
``rollout_corr/*``                  rollout vs trainer log-prob mismatch and IS / rejection statistics
                                    (decoupled mode; ``asyncrl/trainer/rollout_correction.py``)
``trainer/dropped_stale``           prompt groups the trainer dropped for staleness so far (at fetch; see also
                                    ``rollouter/dropped_stale_in_generation``)
``trainer/dropped_dapo_no_signal``  prompt groups dropped by DAPO's ``filter_groups`` so far
``sync/*``                          weight-sync phase timings (pause, transfer, resume, total)
``sync/replica_faults``             1 when a replica died during the sync (resent to the live ones)
``timing/*``                        trainer step phases (fetch, update, step; gen with hybrid_engine)
``reward/<key>``                    extras of a dict-valued rule reward, mean over the step's
                                    responses (``word_problems``: ``reward/acc``, ``reward/format``)
``agent/tool_errors/<kind>``        tool calls of the step's trajectories that failed, by kind (``exception``:
                                    the tool raised; ``tool_error``, ``timeout``, ``unknown_tool``, ...)
``agent/sandbox/errors/<kind>``     sandboxed trial attempts of the step that ended with an error, by kind
                                    (``context_length_exceeded``, ``agent_timeout``, ``other``, ...)
``eval/accuracy``                   held-out greedy accuracy (``eval.csv``, by param version); the
                                    rule's ``acc`` when it reports one, else its score, over the ``n``
                                    scored of the ``rows`` evaluated; ``accuracy_of``: ``acc``, ``rule``
                                    (a built-in 0/1 rule) or ``score`` (a custom reward's mean score)
``eval/<key>``                      held-out means of ``agent/*`` and ``reward/*`` metrics
                                    (``eval/format``: rate of well-formed ``#### <integer>`` answers;
                                    ``eval/tool_call_success_rate``: mean share of a sample's tool calls
                                    answered without error; ``eval/tool_calls``, ``..._count``: per sample)
``eval/failed``                     held-out samples that failed (not scored); ``eval/failed_reasons``:
                                    their count by reason (exception type, ``prompt_too_long``)
==================================  =========================================================
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from asyncrl.tracking import STEP_COLUMNS


RENAMED = {"eval/tool_call_success": "eval/tool_call_success_rate"}
"""Old metric name -> new, for rows written before a rename (a checkpoint's evaluation history)."""


def renamed(row: dict) -> dict:
    """``row`` with old metric names (:data:`RENAMED`) under their new names."""
    return {RENAMED.get(k, k): v for k, v in row.items()}


def plot_run(history: pd.DataFrame, evals: pd.DataFrame, path: Path) -> Path:
    """PNG with reward / held-out accuracy (top) and staleness lag (bottom) over trainer steps."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from matplotlib.ticker import MaxNLocator

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    # wide lines under narrow ones with markers: equal values (a short run's zeros, lag mean = lag max) stay visible
    if not evals.empty and "step" in evals:
        ax1.plot(evals["step"], evals["accuracy"], "o-", lw=3, ms=7, label="held-out greedy accuracy", color="tab:green")
    if not history.empty:
        ax1.plot(history["step"], history["reward/mean"], "s-", ms=3, label="train reward (mean)", color="tab:blue")
        ax2.plot(history["step"], history["staleness/lag_max"], label="lag max", color="tab:red", linestyle="--", lw=3)
        ax2.plot(history["step"], history["staleness/lag_mean"], "s-", ms=3, label="lag mean", color="tab:orange")
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.set_ylabel("reward / accuracy")
    ax1.set_ylim(-0.02, 1.02)
    # legends above their panels, never over the curves (a run's late points sit wherever its values end)
    for ax in (ax1, ax2):  # a run without a step or evaluation has no curve: no legend (matplotlib warned)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, frameon=False, borderaxespad=0.2)
    ax2.set_ylabel("version lag")
    ax2.set_xlabel("trainer step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run_files(run_dir: str | Path) -> list[str]:
    """What a run directory holds, by name in name order, as a "saved ..." line lists it: its files, and its folders
    with a trailing ``/`` (``tensorboard/``, ``wandb/``) except ``checkpoints/`` (the line names the last checkpoint
    itself). Read from the directory, so the line says what was written; ``[]`` when it does not exist."""
    p = Path(run_dir)
    if not p.is_dir():
        return []
    return sorted(f.name + ("/" if f.is_dir() else "") for f in p.iterdir() if f.name != "checkpoints")


EVAL_COLUMNS = ("version", "accuracy", "n", "rows", "accuracy_of", "time", "eval_s", "eval/failed", "eval/failed_reasons")
"""``eval.csv``'s columns of every evaluation (:func:`asyncrl.evaluation.evaluate`); the header of a run without one."""


def write_run_artifacts(run_dir: Path, history: list[dict], eval_history: list[dict], config_yaml: str,
                        summary: dict[str, Any], write_metrics: bool = True) -> dict[str, Path]:
    """Write ``metrics.csv``, ``eval.csv``, ``config.yaml``, ``summary.json`` and ``plot.png``.

    ``write_metrics=False`` leaves ``metrics.csv`` as streamed by :class:`asyncrl.tracking.Tracking`.
    Returns the paths by kind. Raises ``OSError`` if ``run_dir`` cannot be written.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    hist = pd.DataFrame(history)
    evals = pd.DataFrame(eval_history)
    if not evals.empty and not hist.empty:
        # map each evaluation's param version to the first trainer step that reached it
        first_step = hist.groupby("param_version")["step"].min().to_dict()
        evals["step"] = [0 if v == 0 else first_step.get(v, hist["step"].max()) for v in evals["version"]]
    paths = {"metrics": run_dir / "metrics.csv", "eval": run_dir / "eval.csv", "config": run_dir / "config.yaml",
             "summary": run_dir / "summary.json", "plot": run_dir / "plot.png"}
    if write_metrics:  # a run without a step still gets the header (pandas reads an empty file as an error)
        (hist if not hist.empty else pd.DataFrame(columns=list(STEP_COLUMNS))).to_csv(paths["metrics"], index=False)
    # no evaluation (no held-out rows: data.train_files without data.val_files): the header, so pandas reads it
    (evals if not evals.empty else pd.DataFrame(columns=list(EVAL_COLUMNS))).to_csv(paths["eval"], index=False)
    paths["config"].write_text(config_yaml)
    paths["summary"].write_text(json.dumps(summary, indent=2, default=str))
    plot_run(hist, evals, paths["plot"])
    return paths

