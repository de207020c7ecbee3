"""asyncrl.sim.sweep and ``asyncrl sim``: what they do with the inputs a user gets wrong (session 23's tester).

Mistakes that hold for every point raise before the first point runs (they made one error row per point, or a
silent wrong sweep); the table says how many GPUs each row holds; the timeline's areas are true to time; the CLI
reads verl's GPU keys as the split and suggests the closest name.
"""

import collections

import pytest

from asyncrl.config import ConfigError
from asyncrl.sim import h20_qwen25_7b
from asyncrl.sim.sweep import plot_sweep, sweep
from test_sim import _config, _cost


@pytest.fixture
def nothing_runs(monkeypatch):
    """Fails the test if sweep() simulates anything: the mistake must be found before the first point."""
    import asyncrl.sim.sweep as sweep_module

    def simulate(*a, **kw):
        raise AssertionError("sweep() ran a point")

    monkeypatch.setattr(sweep_module, "simulate", simulate)


def _base(steps=1):
    cfg = _config("d")
    cfg.trainer.total_training_steps = steps
    return cfg


@pytest.mark.parametrize("value, error, says", [
    ("0.5", TypeError, "got '0.5' (a str, which would be swept one character at a time); for one value write ['0.5']"),
    (0.5, TypeError, "got 0.5 (float); for one value write [0.5]"),
    (None, TypeError, "for one value write [None]"),
    ({"a": 1}, TypeError, "must be a list of values to sweep"),
    ([], ValueError, "is empty: give at least one value"),
    (range(0), ValueError, "is empty"),
])
def test_a_grid_value_must_be_a_non_empty_list_of_values(nothing_runs, value, error, says):
    """``"0.5"`` was swept as 0, "." and 5 (staleness 5, silently); ``0.5`` raised "'float' object is not
    iterable"; ``[]`` returned an empty table without a word."""
    with pytest.raises(error) as exc:
        sweep(_base(), _cost(), {"async_training.staleness_threshold": value})
    assert "grid['async_training.staleness_threshold']" in str(exc.value) and says in str(exc.value), exc.value


def test_any_iterable_of_values_is_a_grid_value():
    import numpy as np

    df = sweep(_base(), _cost(), {"async_training.staleness_threshold": np.array([0.0]),
                                  "async_training.trigger_parameter_sync_step": range(1, 2)})
    assert len(df) == 1 and "error" not in df and df["samples_per_s"].iloc[0] > 0


@pytest.mark.parametrize("kwargs, error, says", [
    ({"cost": h20_qwen25_7b}, TypeError, "cost must be a ClusterCostModel"),
    ({"cost": h20_qwen25_7b}, TypeError, "call it, e.g. h20_qwen25_7b()"),
    ({"cost": "h20-qwen2.5-7b"}, TypeError, "got str"),
    ({"token_scale": 0}, ConfigError, "token_scale is real tokens per simulated token, at least 1; got 0"),
    ({"token_scale": 1.5}, TypeError, "a whole number >= 1; got 1.5"),
    ({"snapshot_every": 5.0}, TypeError, "unexpected keyword argument 'snapshot_every'"),
    ({"snapshot_every": 5.0}, TypeError, "did you mean 'snapshot_every_s'?"),
    ({"name": "x"}, TypeError, "names each point from its grid values"),
    ({"rollout_gpus": 0}, ValueError, "rollout_gpus must be a whole number >= 1"),
    ({"cost": h20_qwen25_7b(), "train_gpus": 6}, ConfigError, "train_gpus must be a multiple of h20-qwen2.5-7b's 4"),
])
def test_a_mistake_that_holds_for_every_point_raises_before_the_first(nothing_runs, kwargs, error, says):
    """A preset not called, ``token_scale=0`` or a mistyped simulate() keyword made one error row per point."""
    cost = kwargs.pop("cost", _cost())
    with pytest.raises(error) as exc:
        sweep(_base(), cost, {"async_training.staleness_threshold": [0.0, 0.5]}, **kwargs)
    assert says in str(exc.value), exc.value


@pytest.mark.parametrize("grid, error, says", [
    ({"split": [(1, 1, 1)]}, ValueError, "each 'split' value is a (rollout_gpus, train_gpus) pair"),
    ({"split": [2]}, ValueError, "pair of whole numbers >= 1 (GPUs), got 2"),
    ({"split": ["8:8"]}, ValueError, "got '8:8'"),
    ({"split": [(1.5, 1)]}, ValueError, "rollout_gpus must be a whole number >= 1"),
    ({"split": [(1, 0)]}, ValueError, "train_gpus must be a whole number >= 1"),
    ({"Split": [(1, 1)]}, ConfigError, "unknown grid key 'Split'"),
    ({"Split": [(1, 1)]}, ConfigError, "did you mean 'split'?"),
    ({"splits": [(1, 1)]}, ConfigError, "did you mean 'split'?"),
    ({"async_training.staleness_treshold": [0]}, ConfigError, "did you mean 'async_training.staleness_threshold'?"),
    ({"staleness_threshold": [0]}, ConfigError, "did you mean 'async_training.staleness_threshold'?"),
    ({"rollout_gpus": [8]}, ValueError, "'rollout_gpus' is not a grid key"),
    ({"train_gpus": [8]}, ValueError, "use the grid key 'split': [(rollout_gpus, train_gpus), ...]"),
    ({"token_scale": [64]}, ValueError, "pass sweep(..., token_scale=...)"),
])
def test_a_grid_key_or_split_that_cannot_run_is_refused_by_name(nothing_runs, grid, error, says):
    """``split`` as ``(1, 1, 1)`` / ``2`` failed each point with "too many values to unpack" / "cannot unpack
    non-iterable int"; ``Split`` suggested 'algorithm'; ``rollout_gpus`` suggested 'rollout'."""
    with pytest.raises(error) as exc:
        sweep(_base(), _cost(), grid)
    assert says in str(exc.value), exc.value


def test_a_split_is_checked_against_the_cost_models_units(nothing_runs):
    from asyncrl.sim import cpu_embedded_vllm

    with pytest.raises(ConfigError, match=r"split \(6, 8\): rollout_gpus must be a multiple of h20-qwen2.5-7b's 4 GPUs "
                                          r"per rollout replica; got 6 \(try 4\)"):
        sweep(_base(), h20_qwen25_7b(), {"split": [(8, 8), (6, 8)]})
    with pytest.raises(ValueError, match=r"rollout_gpus must be a whole number >= 1 \(units of cores of "
                                         r"cpu-embedded-vllm-1core\), got 1.5"):
        sweep(_base(), cpu_embedded_vllm(1), {"split": [(1.5, 1)]})


def test_the_table_says_how_many_gpus_each_kind_of_row_holds():
    """``split`` (8, 8) is one pool of 8 GPUs on a colocated row and 16 GPUs on an async one; both rows showed
    rollout_gpus 8 / train_gpus 8 and no total."""
    df = sweep(_base(), _cost(), {"actor_rollout_ref.hybrid_engine": [True, False],
                                  "async_training.staleness_threshold": [0], "split": [(1, 1), (2, 2)]})
    assert "error" not in df, df.get("error")
    got = {(h, s): g for h, s, g in zip(df["actor_rollout_ref.hybrid_engine"], df["split"], df["gpus"])}
    assert got == {(True, (1, 1)): 1, (True, (2, 2)): 2, (False, (1, 1)): 2, (False, (2, 2)): 4}
    cols = list(df.columns)
    assert cols.index("gpus") == cols.index("train_gpus") + 1
    doc = " ".join(sweep.__doc__.split())
    assert "one pool of ``rollout_gpus`` GPUs" in doc and "The ``gpus`` column is the total" in doc
    assert cols.count("gpus") == 1  # the summary's own column, once


def test_plot_sweep_names_a_missing_column_and_an_all_error_table():
    import pandas as pd

    failed = pd.DataFrame({"split": [(1, 1, 1), (2, 2, 2)], "error": ["ValueError: too many values", "ValueError: x"]})
    with pytest.raises(ValueError, match=r"every point of this sweep failed \(2 row\(s\)\).*the first error: "
                                         r"ValueError: too many values"):
        plot_sweep(failed, x="split")
    df = pd.DataFrame({"async_training.staleness_threshold": [0.0, 0.5], "samples_per_s": [0.2, 0.3],
                       "trainer_idle_ratio": [0.5, 0.4], "error": [None, None]})
    for kw, bad in (({"x": "staleness_threshold"}, "x='staleness_threshold'"), ({"y": "samples/s"}, "y='samples/s'"),
                    ({"hue": "Split"}, "hue='Split'")):
        kw = {"x": "async_training.staleness_threshold", **kw}
        with pytest.raises(ValueError) as exc:
            plot_sweep(df, **kw)
        msg = str(exc.value)
        assert f"plot_sweep({bad}): the table has no such column" in msg and "samples_per_s" in msg, msg
    with pytest.raises(ValueError, match="did you mean 'async_training.staleness_threshold'"):
        plot_sweep(df, x="async_training.staleness_treshold")


def _drawn(ax):
    """Total drawn width per label, and each lane's bars ``(y, x0, x1)``."""
    width, bars = collections.Counter(), []
    for coll in ax.collections:
        for path in coll.get_paths():
            xs, ys = path.vertices[:, 0], path.vertices[:, 1]
            width[coll.get_label()] += xs.max() - xs.min()
            bars.append((round(float(ys.min()), 3), float(xs.min()), float(xs.max())))
    return width, bars


def test_the_timeline_draws_each_label_as_long_as_it_ran():
    """On a 7B run every short prefill span was widened to wall/400 (~2 s here, 6 s on a longer run) and painted
    over decode: the replicas read almost all "prefill" (drawn 8,966 s of prefill against 62 s run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from asyncrl.sim import simulate
    from asyncrl.sim.scenarios import verl_dapo_7b
    from asyncrl.sim.sweep import plot_timeline

    res = simulate(verl_dapo_7b(False, max_response=16384, steps=1), h20_qwen25_7b(), rollout_gpus=8, train_gpus=8,
                   token_scale=64)
    ran = collections.Counter()
    for lane, s, e, label in res.timeline.spans:
        if lane.startswith("replica") or lane == "trainer":
            ran[label] += e - s
    ax = plot_timeline(res)
    drawn, bars = _drawn(ax)
    plt.close(ax.figure)
    assert ran["prefill"] > 0 and ran["decode"] > 10 * ran["prefill"]
    for label in ("prefill", "decode", "update"):
        assert drawn[label] == pytest.approx(ran[label], rel=0.01), (label, drawn[label], ran[label])
    by_lane = collections.defaultdict(list)
    for y, x0, x1 in bars:
        by_lane[y].append((x0, x1))
    for y, spans in by_lane.items():  # no bar is drawn over another
        spans.sort()
        assert all(b[0] >= a[1] - 1e-6 for a, b in zip(spans, spans[1:])), y


def test_a_lone_short_span_stays_visible_without_covering_another():
    """The widening's purpose (a 10 ms weight load in an 18 s window) is kept, in the idle time beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from asyncrl.sim import simulate
    from asyncrl.sim.sweep import plot_timeline

    res = simulate(_base(steps=6), _cost())
    ax = plot_timeline(res, max_replicas=1)
    drawn, bars = _drawn(ax)
    plt.close(ax.figure)
    loads = [e - s for lane, s, e, lab in res.timeline.spans if lane == "replica_0" and lab == "weight load"]
    assert loads and drawn["weight load"] > 1.5 * sum(loads)
    ran_decode = sum(e - s for lane, s, e, lab in res.timeline.spans if lane == "replica_0" and lab == "decode")
    assert drawn["decode"] == pytest.approx(ran_decode, rel=1e-6)
    by_lane = collections.defaultdict(list)
    for y, x0, x1 in bars:
        by_lane[y].append((x0, x1))
    for spans in by_lane.values():
        spans.sort()
        assert all(b[0] >= a[1] - 1e-9 for a, b in zip(spans, spans[1:]))


def _cli_row(capsys):
    legend, head, row = capsys.readouterr().out.strip().splitlines()[-3:]
    back = {c: len(head.split()) - i for i, c in enumerate(head.split())}  # from the end: "run" has spaces
    return legend, {c: row.split()[-b] for c, b in back.items() if c != "run"}


def test_cli_reads_verls_gpu_keys_as_the_split(capsys):
    """``rollout.n_gpus_per_node=8 trainer.n_gpus_per_node=8`` on h20 simulated 32 rollout GPUs (8 replicas x TP 4)
    and 64 trainer GPUs (the trainer keys ignored), without a word."""
    from asyncrl.cli import main

    gpu_keys = ["--preset", "h20-qwen2.5-7b", "actor_rollout_ref.actor.strategy=fsdp2", "rollout.n_gpus_per_node=8",
                "trainer.n_gpus_per_node=8", "steps=1", "--token-scale", "64"]
    assert main(["sim", *gpu_keys]) == 0
    legend, cols = _cli_row(capsys)
    assert (cols["rollout_gpus"], cols["train_gpus"], cols["gpus"], cols["replicas"], cols["train_ranks"]) == (
        "8", "8", "16", "2", "2"), cols
    assert "from the config's rollout.nnodes x rollout.n_gpus_per_node and trainer.nnodes x" in legend
    # the same numbers as options agree with the keys; a different one is refused
    assert main(["sim", *gpu_keys, "--rollout-gpus", "8", "--train-gpus", "8"]) == 0
    assert _cli_row(capsys)[1]["gpus"] == "16"
    assert main(["sim", *gpu_keys, "--rollout-gpus", "16"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: --rollout-gpus 16 contradicts the config's rollout.nnodes x "
                          "rollout.n_gpus_per_node = 8 GPUs for rollout"), err
    # colocated: the trainer's GPUs are the one pool
    assert main(["sim", "--preset", "h20-qwen2.5-7b", "--recipe", "longtail_colocated_cpu",
                 "actor_rollout_ref.actor.strategy=fsdp2", "trainer.n_gpus_per_node=8", "steps=1"]) == 0
    legend, cols = _cli_row(capsys)
    assert (cols["hybrid_engine"], cols["rollout_gpus"], cols["train_gpus"], cols["gpus"]) == ("True", "8", "8", "8")


def test_cli_help_says_the_default_split_and_the_token_units(capsys):
    from asyncrl.cli import main

    with pytest.raises(SystemExit):
        main(["sim", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Default: the config's rollout.nnodes x rollout.n_gpus_per_node" in out
    assert "16 ranks x 4 = 64 GPUs" in out
    assert "rollout.response_length and data.length_workload.median are then in simulated tokens" in out


@pytest.mark.parametrize("argv, says", [
    (["--recipe", "longtail_colocated"], "; did you mean 'longtail_colocated_cpu'?"),
    (["--preset", "H20"], "; did you mean 'h20-qwen2.5-7b'?"),
    (["--preset", "h200"], "; did you mean 'h200-qwen2.5-0.5b-hf'?"),
    (["--cores", "1", "rollout_gpus=1.5"],
     "rollout_gpus=1.5 is not a config key: use --rollout-gpus 1.5 (a whole number of units of --cores cores)"),
    (["token_scale=64"], "token_scale=64 is not a config key: use --token-scale 64"),
])
def test_cli_suggests_the_closest_name(capsys, argv, says):
    """The README promises the closest name; ``--recipe longtail_colocated`` and ``--preset H20`` gave none."""
    from asyncrl.cli import main

    assert main(["sim", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: ") and says in err and "Traceback" not in err, err


def test_cli_notes_a_gpu_preset_on_its_default_split_and_the_tasks_own_lengths(capsys):
    """s35 newcomer #10: ``--preset h20-qwen2.5-7b`` on the default recipe simulated 4 rollout GPUs against 64 trainer
    GPUs on the embedded arith task's ~20-token responses at 7B prices, without a word on either."""
    from asyncrl.cli import main

    assert main(["sim", "--preset", "h20-qwen2.5-7b", "steps=1"]) == 0
    out = capsys.readouterr().out
    assert ("note: no rollout:trainer split given: h20-qwen2.5-7b's default, 4 rollout GPUs (rollout.num_replicas=1 x 4 "
            "a replica) against 64 trainer GPUs (the preset's trainer); give --rollout-gpus / --train-gpus") in out
    assert "note: h20-qwen2.5-7b prices a large model's tokens, and this config's responses are its task's own (arith" in out
    assert main(["sim", "--preset", "h20-qwen2.5-7b", "--token-scale", "-1"]) == 2  # refused before any note
    assert "note:" not in capsys.readouterr().out
    assert main(["sim", "--preset", "h20-qwen2.5-7b", "steps=1", "--rollout-gpus", "8", "--train-gpus", "8",
                 "data.length_workload.distribution=lognormal", "data.length_workload.median=40"]) == 0
    assert "note:" not in capsys.readouterr().out
