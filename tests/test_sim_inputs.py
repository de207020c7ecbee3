"""asyncrl.sim refuses what it cannot simulate, and says how a run ended (session 23's tester).

Each test here failed before its fix: a simulation that started Ray actors, ran data a real run refuses,
spun forever on a cost model that prices no time, stopped on a CPU demo's time budget without a word, or
took a preset's name for a cost model.

The timeouts guard what hung before its fix; ``method="thread"``: a simulation spins inside its event loop's
callbacks, which swallow the exception the signal method raises (the run went on for 20 minutes), so a hang
ends the test session with every thread's stack instead.
"""

import asyncio
import dataclasses
import logging
import math
import pickle

import pytest

from asyncrl.config import ConfigError, ExperimentConfig, load_config
from asyncrl.rollout.base import SamplingParams
from asyncrl.sim import ClusterCostModel, RolloutCostModel, SyncCostModel, TrainCostModel, simulate
from asyncrl.sim.clock import run
from asyncrl.sim.engines import CostModelInferenceEngine
from test_sim import _config, _cost

# ---------------------------------------------------------------------------------------------- no Ray


class _Body:
    def ping(self) -> int:
        return 1


@pytest.mark.timeout(300, method="thread")
def test_a_simulation_runs_agent_workers_in_process_and_never_starts_ray(caplog):
    """``ExperimentConfig()`` asks for one agent-loop worker actor (``rollout.agent.num_workers=1``): the simulation
    started it through Ray, it could not unpickle the in-process handles (RecursionError) and every group failed."""
    import ray

    cfg = load_config(base=ExperimentConfig(), overrides=["trainer.total_training_steps=2", "data.train_size=256"])
    assert cfg.actor_rollout_ref.rollout.agent.num_workers == 1
    ray_before = ray.is_initialized()
    with caplog.at_level(logging.INFO, logger="asyncrl.sim.runner"):
        res = simulate(cfg, _cost())
    assert len(res.history) == 2 and res.trained > 0
    assert any("num_workers=1 is ignored" in r.getMessage() for r in caplog.records)
    assert cfg.actor_rollout_ref.rollout.agent.num_workers == 1  # the caller's config is left as it was
    if not ray_before:  # another test of the session may have started Ray: then only the run above is checked
        assert not ray.is_initialized()


def test_simulated_modules_cannot_start_ray_or_pickle_an_in_process_handle():
    """The kind behind the case above: whatever path of a simulated module reaches for Ray gets a clear error, not
    a Ray actor that cannot work (it unpickled a LocalActorHandle into a RecursionError)."""
    import asyncrl.agent_loop.worker as worker
    from asyncrl.sim.handles import LocalActorHandle, object_store

    handle = LocalActorHandle(_Body())
    with pytest.raises(TypeError, match="LocalActorHandle of _Body lives in the simulation's process and cannot be pickled"):
        pickle.dumps(handle)
    blank = LocalActorHandle.__new__(LocalActorHandle)  # as an unpickler makes it: no _obj yet
    assert not hasattr(blank, "__setstate__") and not hasattr(blank, "anything")
    with object_store():
        with pytest.raises(RuntimeError, match=r"never starts Ray.*ray.remote\(AgentLoopWorker\)"):
            worker.ray.remote(worker.AgentLoopWorker)
        with pytest.raises(RuntimeError, match="never starts Ray"):
            worker.ray.init()
    assert worker.ray.remote is not None and worker.ray.__name__ == "ray"  # the real module is back


# ---------------------------------------------------------------------------------------------- pre-flight


@pytest.mark.timeout(60, method="thread")
@pytest.mark.parametrize("key, value, says", [
    ("max_prompt_length", 1, r"only 0 of \d+ prompts fit data.max_prompt_length=1 tokens"),
    ("train_size", 10, r"the training data has 10 prompts but one trainer step needs required_samples"),
], ids=["max_prompt_length", "train_size"])
def test_simulate_refuses_data_that_can_never_fill_a_step_as_a_real_run_does(key, value, says):
    """``asyncrl train`` refuses these before starting (:func:`asyncrl.watchdog.check_can_fill_batch`); ``asyncrl sim``
    spun at 100% CPU forever (every prompt too long) or ran on 10 prompts where a step needs 32."""
    cfg = _config("d")
    setattr(cfg.data, key, value)
    with pytest.raises(ConfigError, match=says):
        simulate(cfg, _cost())


def _jsonl(path, prompts, **extra_info):
    import json

    path.write_text("".join(json.dumps({"data_source": "arith", "prompt": p, "reward_model": {"ground_truth": "2"},
                                        "extra_info": dict(extra_info)}) + "\n" for p in prompts))
    return str(path)


@pytest.mark.timeout(120, method="thread")
def test_simulate_takes_the_configs_own_data_files_as_a_real_run_does(tmp_path):
    """``simulate`` built the task's rows whatever ``data.train_files`` said: a file whose prompts a real run refuses
    (all longer than ``data.max_prompt_length``) was simulated on ``arith`` without a word, and rows carrying their
    answers' lengths (``extra_info.response_tokens``) were answered at ``response_length`` (256) instead."""
    cfg = _config("d")
    cfg.trainer.total_training_steps = 2
    cfg.data.train_files = _jsonl(tmp_path / "long.jsonl", ["what is " + " + ".join(["1"] * 60) + "?"] * 64)
    with pytest.raises(ConfigError, match=r"only 0 of 64 prompts fit data.max_prompt_length=64 tokens"):
        simulate(cfg, _cost())
    cfg.data.train_files = _jsonl(tmp_path / "short.jsonl", [f"what is {i} + 1?" for i in range(64)], response_tokens=7)
    cfg.data.length_workload.distribution = "none"  # the rows' own lengths
    result = simulate(cfg, _cost())
    assert set(result.response_length_counts) == {7} and len(result.history) == 2, result.response_length_counts
    cfg.data.train_files = str(tmp_path / "missing.jsonl")
    from asyncrl.data.dataset import DatasetNotFoundError

    with pytest.raises(DatasetNotFoundError, match="missing.jsonl"):
        simulate(cfg, _cost())


@pytest.mark.timeout(120, method="thread")
def test_colocated_rollout_skips_prompts_too_long_without_counting_them_as_attempts(tmp_path):
    """64 of 640 prompts fit ``data.max_prompt_length``: the pre-flight check takes the data (a step needs 32) and an
    async run trains on it, but the colocated ``generate_batch`` counted each dropped prompt as one of its 4 x 32
    attempts and failed the run at its first step ("128 prompt groups started for a batch of 32")."""
    long = "what is " + " + ".join(["1"] * 60) + "?"
    cfg = _config("colocated")
    cfg.trainer.total_training_steps = 2
    cfg.data.train_files = _jsonl(tmp_path / "mixed.jsonl", [f"what is {i} + 1?" if i % 10 == 0 else long
                                                              for i in range(640)])
    result = simulate(cfg, _cost())
    assert len(result.history) == 2 and result.accounting["dropped"]["prompt_too_long"] > 128


@pytest.mark.timeout(120, method="thread")
@pytest.mark.parametrize("mode", ["d", "colocated"])
def test_a_run_whose_prompts_all_exceed_max_prompt_length_stops_with_the_reason(mode, monkeypatch):
    """With the pre-flight check out of the way (a rollouter not started by ``Experiment`` or ``simulate``), every
    prompt too long: the async rollouter took and dropped the rows forever and the trainer waited (this test hung);
    the colocated one failed with "128 prompt groups started" and nothing about prompt lengths. Both now stop the run
    with the rollouter's reason."""
    from asyncrl.failures import RolloutStopped

    monkeypatch.setattr("asyncrl.watchdog.check_can_fill_batch", lambda *args: 0)
    cfg = _config(mode)
    cfg.trainer.total_training_steps = 2
    cfg.data.max_prompt_length = 1
    with pytest.raises(RolloutStopped, match=r"all 512 training prompts are longer than data.max_prompt_length=1 "
                                             r"tokens, so no prompt group can start"):
        simulate(cfg, _cost())


# ---------------------------------------------------------------------------------------------- cost models

_ROLLOUT = RolloutCostModel(step_s=0.01, per_seq_s=1e-4, per_ctx_token_s=0.0)
_TRAIN = TrainCostModel(per_token_s=2e-5)
_SYNC = SyncCostModel(fixed_s=0.02)
_CLUSTER = ClusterCostModel("unit", _ROLLOUT, _TRAIN, _SYNC)
_BAD = {"float": (-1, -1e-3, float("nan"), float("-inf")), "int": (0, -1)}  # by the field's annotation
_BAD.update({f"Optional[{k}]": v for k, v in _BAD.items()})


@pytest.mark.parametrize("model", [_ROLLOUT, _TRAIN, _SYNC, _CLUSTER], ids=lambda m: type(m).__name__)
def test_every_numeric_field_of_every_cost_model_is_checked(model):
    """``TrainCostModel(per_token_s=-1e-3, per_update_s=-1)`` ran in negative time, ``SyncCostModel(fixed_s=-5)`` was
    taken, ``contention=-1`` stopped the clock: every numeric field (found by its annotation, so a field added later
    is covered too) is refused, by ``replace`` as by the constructor, naming the class, the field and the value."""
    cls = type(model).__name__
    fields = [(f.name, _BAD[f.type]) for f in dataclasses.fields(model) if f.type in _BAD]
    assert len(fields) >= 2
    for name, bads in fields:
        for bad in bads:
            with pytest.raises(ValueError, match=rf"^{cls}\.{name}={bad!r} is not valid"):
                dataclasses.replace(model, **{name: bad})


@pytest.mark.parametrize("make, says", [
    (lambda: RolloutCostModel(step_s=0, per_seq_s=0, per_ctx_token_s=0), r"RolloutCostModel: step_s=0, per_seq_s=0 and "
     r"per_ctx_token_s=0 with no per_iteration_s table: a decode iteration would take no time"),
    (lambda: dataclasses.replace(_ROLLOUT, gpus=0), r"RolloutCostModel\.gpus=0 is not valid: expected a whole number >= 1"),
    (lambda: dataclasses.replace(_ROLLOUT, max_num_seqs=0), r"RolloutCostModel\.max_num_seqs=0 is not valid"),
    (lambda: dataclasses.replace(_ROLLOUT, contention=-1.0), r"RolloutCostModel\.contention=-1\.0 is not valid"),
    (lambda: dataclasses.replace(_ROLLOUT, per_iteration_s={8: math.inf}), r"per_iteration_s entries <= 0 \(or not finite\)"),
    (lambda: dataclasses.replace(_ROLLOUT, per_iteration_s={0: 0.01}), r"per_iteration_s key 0 is not a batch size"),
    (lambda: TrainCostModel(per_token_s=-1e-3, per_update_s=-1), r"TrainCostModel\.per_token_s=-0\.001 is not valid"),
    (lambda: TrainCostModel(per_token_s=1e-3, n_ranks=0), r"TrainCostModel\.n_ranks=0 is not valid"),
    (lambda: TrainCostModel(per_token_s=1e-3, max_token_len=0), r"TrainCostModel\.max_token_len=0 .*or None"),
    (lambda: SyncCostModel(fixed_s=-5), r"SyncCostModel\.fixed_s=-5 is not valid"),
    (lambda: SyncCostModel(bandwidth_gb_s=0), r"SyncCostModel\.bandwidth_gb_s=0 is not valid: expected GB/s > 0"),
    (lambda: dataclasses.replace(_CLUSTER, prompt_tokens=0), r"ClusterCostModel\.prompt_tokens=0 is not valid"),
], ids=["no_decode_term", "gpus", "max_num_seqs", "contention", "table_inf", "table_key", "train_negative",
        "n_ranks", "max_token_len", "sync_negative", "bandwidth", "prompt_tokens"])
def test_cost_models_refuse_what_would_hang_or_divide_by_zero(make, says):
    """The tester's cases: all-zero decode terms and ``contention=-1`` hung in the engine's ``_reschedule``,
    ``gpus=0`` was a bare ZeroDivisionError in ``with_split``."""
    with pytest.raises(ValueError, match=says):
        make()


@pytest.mark.parametrize("make, says", [
    (lambda: dataclasses.replace(_ROLLOUT, step_s="0.01"), r"RolloutCostModel\.step_s='0\.01' \(str\) is not valid: "
     "expected a number"),
    (lambda: dataclasses.replace(_ROLLOUT, max_num_seqs=2.5), r"RolloutCostModel\.max_num_seqs=2\.5 \(float\)"),
    (lambda: dataclasses.replace(_TRAIN, n_ranks=True), r"TrainCostModel\.n_ranks=True \(bool\)"),
    (lambda: ClusterCostModel("x", "h20", _TRAIN), r"ClusterCostModel\.rollout='h20' \(str\) is not valid: expected a "
     "RolloutCostModel"),
], ids=["str", "float_count", "bool_count", "cost_model_class"])
def test_cost_models_refuse_values_of_the_wrong_type(make, says):
    with pytest.raises(TypeError, match=says):
        make()


def test_an_assignment_after_construction_is_checked_and_leaves_the_model_as_it_was():
    """``asyncrl.sim.calibrate.cpu_cost_model`` sets ``rollout.contention`` on a built model: that way in too."""
    model = dataclasses.replace(_ROLLOUT)
    with pytest.raises(ValueError, match=r"RolloutCostModel\.contention=-1\.0"):
        model.contention = -1.0
    with pytest.raises(ValueError, match="a decode iteration would take no time"):
        model.step_s, model.per_seq_s = 0.0, 0.0
    assert model.contention == 0.0 and model.per_seq_s == 1e-4 and model.step_s == 0.0
    model.contention = 0.5
    assert model.contention == 0.5


def test_every_preset_still_constructs():
    from asyncrl.sim.presets import (PRESETS, ROLLOUT_SLOTS, SYNC_S, TRAINER_LAYOUTS, cpu_embedded_vllm,
                                    h200_qwen25_05b_hf)

    built = [make() for make in PRESETS.values()] + [cpu_embedded_vllm(2)]
    built += [h200_qwen25_05b_hf(s, layout, slots) for s in SYNC_S for layout in TRAINER_LAYOUTS
              for slots in ROLLOUT_SLOTS]
    assert all(isinstance(c, ClusterCostModel) for c in built) and len(built) >= 7


@pytest.mark.timeout(60, method="thread")
def test_a_decode_interval_too_small_for_the_clock_still_finishes_its_requests():
    """The same hang from valid values: 100 iterations of 1e-15 s at t = 1e6 s do not move a float clock, so the
    engine's timer fired at the same instant, advanced nothing and rescheduled itself forever."""
    async def main():
        eng = CostModelInferenceEngine(RolloutCostModel(step_s=1e-15, per_seq_s=0.0, per_ctx_token_s=0.0), prompt_tokens=10)
        await asyncio.sleep(1e6)
        out = await eng.generate("a", [1, 2], SamplingParams(max_tokens=100, ignore_eos=True))
        return out, asyncio.get_running_loop().time()

    out, t = run(main)
    assert len(out.token_ids) == 100 and out.stop_reason == "length" and t == pytest.approx(1e6)


# ---------------------------------------------------------------------------------------------- how a run ended


def test_a_run_cut_short_by_its_time_budget_says_so(caplog):
    """``trainer.total_time_s`` counts simulated seconds: the recipes' CPU-demo budget (450-600 s) ended a 7B run at
    step 24 of 300 with nothing in the result or the table to say why."""
    cfg = _config("d")
    cfg.trainer.total_time_s = 3.0
    with caplog.at_level(logging.WARNING, logger="asyncrl.sim.runner"):
        cut = simulate(cfg, _cost())
    row = cut.summary()
    assert len(cut.history) < 6 and row["steps"] == len(cut.history) and row["steps_asked"] == cut.steps_asked == 6
    assert row["stop_reason"] == "total_time_s=3 (simulated s)"
    assert cut.stop_reason.startswith("time budget trainer.total_time_s=3 reached at step")
    assert any(r.levelno == logging.WARNING and "stopped by trainer.total_time_s=3 simulated seconds after "
               f"{len(cut.history)} of 6 steps" in r.getMessage() for r in caplog.records)
    whole = simulate(_config("d"), _cost())
    assert whole.summary()["stop_reason"] == "steps" and whole.stop_reason == "trainer.total_training_steps=6 reached"


def test_seats_above_the_cost_models_are_a_warning_and_the_row_shows_asked_and_used(caplog):
    cfg = _config("d")
    cfg.actor_rollout_ref.rollout.max_num_seqs = 1000
    cfg.trainer.total_training_steps = 2
    with caplog.at_level(logging.INFO, logger="asyncrl.sim.runner"):
        res = simulate(cfg, _cost())
    said = [r for r in caplog.records if "max_num_seqs=1000" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING and "unit's 256 seats per replica" in said[0].getMessage()
    row = res.summary()
    assert (row["max_num_seqs"], row["max_num_seqs_asked"]) == (256, 1000)


# ---------------------------------------------------------------------------------------------- arguments


@pytest.mark.timeout(60, method="thread")  # before: max_rows=0 or a natural_length that is not a function ran forever
@pytest.mark.parametrize("kw, error, says", [
    ({"cost": "h20-qwen2.5-7b"}, TypeError, r"simulate: cost='h20-qwen2.5-7b' \(str\) is not valid: expected an "
     r"asyncrl.sim.ClusterCostModel .*'h20-qwen2.5-7b'"),
    ({"config": {"trainer.total_training_steps": 2}}, TypeError, r"simulate: config=.* \(dict\) is not valid"),
    ({"token_scale": 0}, ValueError, r"token_scale \(--token-scale\) is real tokens per simulated token, at least 1; got 0"),
    ({"token_scale": -64}, ValueError, r"token_scale .* at least 1; got -64"),
    ({"token_scale": 1.5}, TypeError, r"simulate: token_scale=1\.5 \(float\) is not valid: expected a whole number"),
    ({"token_scale": "64"}, TypeError, r"simulate: token_scale='64' \(str\)"),
    ({"rollout_gpus": 2.0}, TypeError, r"simulate: rollout_gpus=2\.0 \(float\) is not valid"),
    ({"snapshot_every_s": -1.0}, ValueError, r"simulate: snapshot_every_s=-1\.0 is not valid"),
    ({"max_rows": 0}, ValueError, r"simulate: max_rows=0 is not valid"),
    ({"natural_length": 5}, TypeError, r"simulate: natural_length=5 is not valid: expected a function or None"),
    ({"name": 3}, TypeError, r"simulate: name=3 \(int\)"),
], ids=["cost_str", "config_dict", "token_scale_0", "token_scale_negative", "token_scale_float", "token_scale_str",
        "rollout_gpus_float", "snapshot_negative", "max_rows_0", "natural_length", "name"])
def test_simulate_refuses_arguments_it_does_not_take_by_name(kw, error, says):
    """A preset's name where its cost model goes was ``AttributeError: 'str' object has no attribute 'rollout'``; a
    float token scale ran, rounded down inside the engine."""
    args = {"config": _config("d"), "cost": _cost()}
    args.update(kw)
    config, cost = args.pop("config"), args.pop("cost")
    with pytest.raises(error, match=says):
        simulate(config, cost, **args)


# ---------------------------------------------------------------------------------------------- the summary row


def test_the_summary_row_blanks_what_does_not_apply_and_counts_the_gpus_used():
    """``partial_rollout_mode`` read "abort" in a run without partial rollout, colocated rows read
    ``partial_rollout=True``; ``gpus``: rollout + trainer for async runs, the one shared pool when colocated."""
    rows = {}
    for mode, kw in (("c", {"rollout_gpus": 3, "train_gpus": 2}), ("d", {}), ("colocated", {"rollout_gpus": 2})):
        cfg = _config(mode)
        cfg.trainer.total_training_steps = 2
        rows[mode] = simulate(cfg, _cost(), **kw).summary()
    assert (rows["c"]["partial_rollout"], rows["c"]["partial_rollout_mode"]) == (False, "-")
    assert (rows["d"]["partial_rollout"], rows["d"]["partial_rollout_mode"]) == (True, "abort")
    assert rows["colocated"]["partial_rollout"] == rows["colocated"]["partial_rollout_mode"] == "-"
    assert (rows["c"]["rollout_gpus"], rows["c"]["train_gpus"], rows["c"]["gpus"]) == (3, 2, 5)
    assert rows["d"]["gpus"] == 2
    assert (rows["colocated"]["rollout_gpus"], rows["colocated"]["train_gpus"], rows["colocated"]["gpus"]) == (2, 2, 2)


@pytest.mark.timeout(60, method="thread")
def test_simulate_refuses_dapo_dynamic_sampling_which_its_responses_cannot_feed(capsys):
    """Every simulated response is the same filler token, so every group scores the same and DAPO's
    ``algorithm.filter_groups`` dropped them all: ``asyncrl sim --recipe arith_dapo_cpu`` spun for ever (~1,100
    warnings a minute), or with ``max_num_gen_batches=3`` ended in two tracebacks blaming the data."""
    from asyncrl.cli import main
    from asyncrl.recipes import RECIPES

    cfg = RECIPES["arith_dapo_cpu"]()
    assert cfg.algorithm.filter_groups.enable
    with pytest.raises(ConfigError, match=r"set algorithm.filter_groups.enable=false to simulate the rest"):
        simulate(cfg, _cost())
    code = main(["sim", "--recipe", "arith_dapo_cpu", "trainer.total_training_steps=2", "trainer.total_time_s=0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("config error: algorithm.filter_groups.enable=true") and "\n" not in err, err
    cfg.algorithm.filter_groups.enable = False  # the rest of the recipe simulates
    cfg.trainer.total_training_steps, cfg.trainer.total_time_s = 1, 0
    assert len(simulate(cfg, _cost()).history) == 1


@pytest.mark.timeout(120, method="thread")
def test_asyncrl_sim_says_how_many_prompts_it_skipped_as_too_long(tmp_path, capsys):
    """150 of 200 prompts longer than ``data.max_prompt_length``: ``asyncrl sim`` printed only its table."""
    from asyncrl.cli import main

    long = "what is " + " + ".join(["1"] * 60) + "?"
    path = _jsonl(tmp_path / "mixed.jsonl", [f"what is {i} + 1?" if i % 4 == 0 else long for i in range(200)])
    assert main(["sim", f"data.train_files={path}", "trainer.total_training_steps=2", "trainer.total_time_s=0"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "prompt(s) skipped as longer than data.max_prompt_length=64 tokens" in out[-1], out[-1]
    assert int(out[-1].split()[0]) >= 150, out[-1]


@pytest.mark.timeout(120, method="thread")
def test_asyncrl_sim_reports_a_run_every_sample_failed_as_one_line(tmp_path, capsys, caplog):
    """Session 31's fresh user: a custom reward that raises for every sample ended ``asyncrl sim`` in a Python
    traceback (RolloutStopped, exit 1) after one ERROR line per failed sample (~130). Now: ``sim error: ...`` and exit
    2, as ``asyncrl train`` reports a user's error, and the failures logged as the first one and a count."""
    from asyncrl.cli import main

    reward = tmp_path / "my_reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    raise ValueError('broken reward')\n")
    path = _jsonl(tmp_path / "train.jsonl", [f"what is {i} + 1?" for i in range(64)])
    with caplog.at_level(logging.ERROR, logger="asyncrl"):
        code = main(["sim", f"data.train_files={path}", f"custom_reward_function.path={reward}",
                     "trainer.total_training_steps=2", "trainer.total_time_s=0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("sim error: rollout stopped: ") and "\n" not in err, err
    assert "my_reward.py:compute_score raised ValueError: broken reward" in err and "max_consecutive_failures" in err
    sample_lines = [r for r in caplog.records if r.name == "asyncrl.rollouter" and "failed" in r.getMessage()
                    and not r.getMessage().startswith("rollout stopped")]
    assert len(sample_lines) <= 3 and sample_lines[0].exc_info, [r.getMessage() for r in sample_lines]
    trainer = [r for r in caplog.records if r.name == "asyncrl.trainer.fully_async_trainer"]
    assert trainer and not any(r.exc_info for r in trainer)  # the stop's reason, not a stack


def test_asyncrl_sim_says_how_many_prompts_failed_when_the_run_goes_on(tmp_path, capsys):
    """Session 31's second fresh user: a reward raising on half the rows let ``asyncrl sim`` finish (exit 0) with no
    word of the failures in its summary; now a line counts them by reason, as a real run's summary does."""
    from asyncrl.cli import main

    reward = tmp_path / "half.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    if extra_info['i'] % 2:\n        raise ValueError('odd row')\n    return 1.0\n")
    path = tmp_path / "train.jsonl"
    import json

    path.write_text("".join(json.dumps({"data_source": "arith", "prompt": f"what is {i} + 1?",
                                        "reward_model": {"ground_truth": "2"}, "extra_info": {"i": i}}) + "\n"
                            for i in range(64)))
    code = main(["sim", f"data.train_files={path}", f"custom_reward_function.path={reward}",
                 "trainer.total_training_steps=2", "trainer.total_time_s=0"])
    out = capsys.readouterr().out
    line = next((x for x in out.splitlines() if "failed, not trained" in x), None)
    assert code == 0 and line is not None, out
    assert " prompt(s) failed, not trained (by reason: RewardError " in line and int(line.split()[0]) > 0, line
