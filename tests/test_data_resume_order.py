"""A resume on other training data than the checkpoint's: the data position says what it was a position in."""

from __future__ import annotations

import logging

import pytest

from asyncrl.config import load_config
from asyncrl.data.dataset import train_source
from asyncrl.data.sampler import DataPosition, ResumableSampler


def _resumed(state: dict, caplog, **kw) -> ResumableSampler:
    args = {"num_rows": 7, "seed": 3, "shuffle": True, "source": ["a.jsonl"], **kw}
    s = ResumableSampler(args.pop("num_rows"), args.pop("seed"), **args)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="asyncrl.data.sampler"):
        s.restore(state)
    return s


def test_the_same_data_resumes_where_it_stopped_silently(caplog):
    full = ResumableSampler(7, 3, source=["a.jsonl"])
    stream = [full.advance() for _ in range(20)]
    part = ResumableSampler(7, 3, source=["a.jsonl"])
    for _ in range(9):
        part.advance()
    state = part.state_dict()
    assert state == {"epoch": 1, "offset": 2, "rows": 7, "source": ["a.jsonl"], "seed": 3, "shuffle": True}
    resumed = _resumed(state, caplog)
    assert caplog.records == [] and [resumed.advance() for _ in range(11)] == stream[9:]


def test_another_row_count_restarts_the_epoch_with_a_warning(caplog):
    state = {"epoch": 1, "offset": 5, "rows": 7, "source": ["a.jsonl"], "seed": 3, "shuffle": True}
    resumed = _resumed(state, caplog, num_rows=9, source=["a.jsonl", "b.jsonl"])
    assert resumed.position == DataPosition(1, 0)
    (msg,) = [r.getMessage() for r in caplog.records]
    assert msg == ("resume: the training data has 9 rows where the checkpoint's had 7 (data.train_files changed?): "
                   "its position (epoch 1, offset 5) no longer means the same rows, so the data order restarts from "
                   "the start of epoch 1; source was ['a.jsonl'], now ['a.jsonl', 'b.jsonl']")
    assert sorted(resumed.advance() for _ in range(9)) == list(range(9))  # the new epoch takes every row once


def test_other_files_or_seed_of_the_same_size_keep_the_position_with_a_warning(caplog):
    state = {"epoch": 0, "offset": 4, "rows": 7, "source": ["a.jsonl"], "seed": 3, "shuffle": True}
    resumed = _resumed(state, caplog, seed=4, source=["c.jsonl"])
    assert resumed.position == DataPosition(0, 4)
    (msg,) = [r.getMessage() for r in caplog.records]
    assert msg == ("resume: the training data's order is not the checkpoint's; source was ['a.jsonl'], now "
                   "['c.jsonl']; seed was 3, now 4: its position (epoch 0, offset 4) is kept, but the rows it points "
                   "at may differ")


def test_a_checkpoint_from_before_the_row_count_resumes_as_it_did(caplog):
    resumed = _resumed({"epoch": 2, "offset": 3}, caplog)
    assert resumed.position == DataPosition(2, 3) and caplog.records == []
    assert DataPosition.from_state(resumed.state_dict()) == DataPosition(2, 3)


def test_the_source_is_the_files_or_the_task(tmp_path, monkeypatch):
    assert train_source(load_config().data) == ["<task arith>"]
    a, b = str(tmp_path / "a.jsonl"), str(tmp_path / "b.parquet")
    assert train_source(load_config(None, [f"data.train_files={a}"]).data) == [a]  # not there: the path alone
    assert train_source(load_config(None, [f"data.train_files=[{a},{b}]"]).data) == [a, b]
    # session 31's fresh user: the same relative name in another directory resumed a checkpoint of other data
    for d, text in (("one", "x" * 10), ("two", "y" * 12)):
        (tmp_path / d).mkdir()
        (tmp_path / d / "train.jsonl").write_text(text)
    monkeypatch.chdir(tmp_path / "one")
    one = train_source(load_config(None, ["data.train_files=train.jsonl"]).data)
    assert one == [f"{tmp_path / 'one' / 'train.jsonl'} (10 bytes)"]
    monkeypatch.chdir(tmp_path / "two")
    assert train_source(load_config(None, ["data.train_files=train.jsonl"]).data) != one
    (tmp_path / "one" / "train.jsonl").write_text("x" * 11)  # rewritten in place: other data too
    monkeypatch.chdir(tmp_path / "one")
    assert train_source(load_config(None, ["data.train_files=train.jsonl"]).data) != one


def test_the_rollouters_checkpoint_part_round_trips_the_sampler():
    from types import SimpleNamespace

    from asyncrl.checkpoint.trainer_state import restore_rollouter

    saved = ResumableSampler(7, 3, source=["a.jsonl"])
    for _ in range(3):
        saved.advance()
    ro = SimpleNamespace(counts={}, sampler=ResumableSampler(7, 3, source=["a.jsonl"]), dropped={}, failed={})
    restore_rollouter(ro, {"taken": 3, "enqueued": 3, "position": saved.state_dict(), "dropped": {}, "failed": {},
                           "eval_history": [], "param_version": 1, "ledger": {"outcomes": {}, "in_flight": []}})
    assert ro.sampler.position == DataPosition(0, 3) and ro.sampler.advance() == saved.advance()


def _checkpoint(tmp_path, position: dict):
    import json

    ck = tmp_path / "run" / "checkpoints" / "global_step_2"
    ck.mkdir(parents=True)
    (ck / "meta.json").write_text(json.dumps({"global_steps": 2}))
    (ck / "rollouter_state.json").write_text(json.dumps({"position": position}))
    return ck


def test_dry_run_logs_the_resumes_data_order_warning_as_a_start_does(tmp_path, caplog, capsys, monkeypatch):
    """``asyncrl train --dry-run`` on a resume whose data changed said nothing of it (the WARNING came from the
    rollouter, once started): :meth:`Experiment.preflight`, which a start and the dry run share, logs it in the
    driver; the rollouter then restores the same position without a second line."""
    from types import SimpleNamespace

    from asyncrl.checkpoint.trainer_state import restore_rollouter
    from asyncrl.cli import main
    from asyncrl.experiment import Experiment

    ck = _checkpoint(tmp_path, {"epoch": 1, "offset": 5, "rows": 7, "source": ["a.jsonl"], "seed": 0, "shuffle": True})
    argv = ["train", "--dry-run", "trainer.resume_mode=resume_path", f"trainer.resume_from_path={ck}",
            f"trainer.default_local_dir={tmp_path}", "trainer.total_training_steps=2"]
    with caplog.at_level(logging.WARNING, logger="asyncrl.data.sampler"):
        assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"would resume from {ck}" in err
    (msg,) = [r.getMessage() for r in caplog.records if r.name == "asyncrl.data.sampler"]
    assert msg.startswith("resume: the training data has ") and "where the checkpoint's had 7" in msg and \
        "source was ['a.jsonl'], now ['<task arith>']" in msg, msg
    # a start runs the same check before anything starts: preflight is where the line comes from
    caplog.clear()
    monkeypatch.setattr("asyncrl.experiment.init_ray", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("stop")))
    monkeypatch.setattr("asyncrl.experiment.ray.is_initialized", lambda: False)
    exp = Experiment(load_config(None, argv[2:]))
    with caplog.at_level(logging.WARNING, logger="asyncrl.data.sampler"), pytest.raises(RuntimeError, match="stop"):
        exp.start()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncrl.data.sampler"] == [msg]
    # the rollouter's restore (in its actor) takes the same position and says nothing more
    caplog.clear()
    ro = SimpleNamespace(counts={}, sampler=ResumableSampler(9, 0, source=["b.jsonl"]), dropped={}, failed={})
    with caplog.at_level(logging.WARNING, logger="asyncrl.data.sampler"):
        restore_rollouter(ro, {"taken": 3, "enqueued": 3, "position": {"epoch": 1, "offset": 5, "rows": 7},
                               "dropped": {}, "failed": {}, "eval_history": [], "param_version": 1,
                               "ledger": {"outcomes": {}, "in_flight": []}})
    assert ro.sampler.position == DataPosition(1, 0) and caplog.records == []
