"""``data.train_files`` edge cases a user met: an empty path alone, a directory in the list, an empty file, and the
simulator's ``max_rows`` taken only from the first files of a list."""

from __future__ import annotations

import logging

import pandas as pd
import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.data.dataset import DatasetError, DatasetIsADirectoryError, load_files, run_rows
from asyncrl.data.sampler import epoch_order
from test_config_data_files import _rows, _write_jsonl


def _prompts(rows: list[dict]) -> list[str]:
    return [r["prompt"][0]["content"] for r in rows]


@pytest.mark.parametrize("key", ["train_files", "val_files"])
def test_an_empty_path_alone_is_refused_not_read_as_the_builtin_task(key, monkeypatch):
    for override in (f"data.{key}=''", f"data.{key}=' '"):
        with pytest.raises(ConfigError, match=rf"^data.{key}='\s?' is an empty path: give a file, or null \(omit "
                                              r"the key\) to use the built-in data.task$"):
            load_config(None, [override])
    monkeypatch.setenv("ASYNCRL_TEST_EMPTY", "")  # an env interpolation that resolves to ""
    with pytest.raises(ConfigError, match=rf"^data.{key}='' is an empty path"):
        load_config(None, [f"data.{key}=${{oc.env:ASYNCRL_TEST_EMPTY}}"])
    assert getattr(load_config(None, [f"data.{key}=null"]).data, key) is None  # null stays the built-in task


def test_an_empty_path_reaching_the_reader_is_refused_too():
    with pytest.raises(DatasetError, match=r"^data.train_files='' is an empty path"):
        load_files("")
    with pytest.raises(DatasetError, match=r"^data.val_files=\[\] names no file"):
        load_files([], "data.val_files")


def test_a_directory_in_the_list_is_named_with_its_position(tmp_path):
    a = _write_jsonl(tmp_path / "a.jsonl", _rows("a", 2))
    for name in ("x.jsonl", "plain_dir"):
        d = tmp_path / name
        d.mkdir()
        with pytest.raises(DatasetIsADirectoryError, match=rf"^dataset path is a directory, not a file: {d} \(.*\) "
                                                           r"\(data.train_files\[1\], file 2 of 2\)$"):
            load_files([a, str(d)])
        with pytest.raises(DatasetIsADirectoryError, match=rf"^dataset path is a directory, not a file: {d} \(.*\) "
                                                           r"\(data.train_files\)$"):
            load_files(str(d))  # alone: its key, no position


@pytest.mark.parametrize("key", ["train_files", "val_files"])
def test_every_error_about_a_file_names_its_key_alone_or_in_a_list(key, tmp_path):
    """A directory given alone was named without the key a list entry had ("dataset path is a directory ...: x"): each
    error about one file (missing, a directory, a bad row, a bad suffix) ends with the key, and a list's its place."""
    d = tmp_path / "dir.jsonl"
    d.mkdir()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"data_source": "a"}\n')
    a = _write_jsonl(tmp_path / "a.jsonl", _rows("a", 2))
    for path in (d, tmp_path / "nope.jsonl", bad, tmp_path / "x.txt"):
        (tmp_path / "x.txt").write_text("")
        with pytest.raises(DatasetError, match=rf"\(data.{key}\)$"):
            load_files(str(path), f"data.{key}")
        with pytest.raises(DatasetError, match=rf"\(data.{key}\[1\], file 2 of 2\)$"):
            load_files([a, str(path)], f"data.{key}")
    cfg = load_config(None, [f"data.{key}={d}"])  # through the config, as a run reads it
    with pytest.raises(DatasetIsADirectoryError, match=rf"^dataset path is a directory, not a file: {d} .*"
                                                       rf"\(data.{key}\)$"):
        run_rows(cfg.data, "train" if key == "train_files" else "test", 0)


def test_a_parquet_dataset_directory_is_still_read(tmp_path):
    d = tmp_path / "ds.parquet"
    d.mkdir()
    pd.DataFrame(_rows("p", 3)).to_parquet(d / "part-0.parquet")
    pd.DataFrame(_rows("q", 2)).to_parquet(d / "part-1.parquet")
    assert sorted(_prompts(load_files([str(d)]))) == sorted(_prompts(_rows("p", 3) + _rows("q", 2)))


def test_cli_names_a_directory_in_one_line(tmp_path, capsys):
    from asyncrl.cli import main

    a = _write_jsonl(tmp_path / "a.jsonl", _rows("a", 64))
    d = tmp_path / "x.jsonl"
    d.mkdir()
    for argv in (["train", "--dry-run"], ["sim", "trainer.total_training_steps=1"]):
        assert main([*argv, f"data.train_files=[{a},{d}]"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"dataset error: dataset path is a directory, not a file: {d} (") and \
            err.endswith("(data.train_files[1], file 2 of 2)"), err


def test_an_empty_file_is_warned_about_and_every_file_empty_refused(tmp_path, caplog):
    a = _write_jsonl(tmp_path / "a.jsonl", _rows("a", 3))
    e = _write_jsonl(tmp_path / "e.jsonl", [])
    with caplog.at_level(logging.WARNING, logger="asyncrl.data.dataset"):
        assert _prompts(load_files([a, e])) == _prompts(_rows("a", 3))
    assert [r.getMessage() for r in caplog.records] == [
        f"data.train_files: {e} has no rows (data.train_files[1], file 2 of 2); is it the file you meant? "
        "(the other files' 3 rows are read)"]
    with pytest.raises(DatasetError, match=rf"^data.train_files: no rows to read: every file is empty \({e}, {e}\)$"):
        load_files([e, e])
    with pytest.raises(DatasetError, match=rf"^data.val_files: no rows to read: the file is empty \({e}\)$"):
        load_files(e, "data.val_files")


def test_a_row_limit_takes_the_rows_a_real_run_takes_first_from_every_file(tmp_path):
    a = _write_jsonl(tmp_path / "a.jsonl", _rows("a", 60))
    b = _write_jsonl(tmp_path / "b.jsonl", _rows("b", 40))
    every = _rows("a", 60) + _rows("b", 40)
    cfg = load_config(None, [f"data.train_files=[{a},{b}]", f"data.val_files=[{a},{b}]", "trainer.seed=7"])
    got = run_rows(cfg.data, "train", 7, limit=50)
    assert _prompts(got) == _prompts([every[i] for i in sorted(epoch_order(100, 7, 0)[:50])])  # the sampler's
    assert any("(a)" in p for p in _prompts(got)) and any("(b)" in p for p in _prompts(got))
    unshuffled = load_config(None, [f"data.train_files=[{a},{b}]", "data.shuffle=false"])
    assert _prompts(run_rows(unshuffled.data, "train", 7, limit=50)) == _prompts(every[:50])  # a run's first 50
    assert _prompts(run_rows(cfg.data, "test", 7, limit=5)) == _prompts(every[:5])  # held-out: the first


def test_the_simulator_sees_every_file_of_a_list(tmp_path):
    """Two files, the second's prompts too long: the first ``max_rows`` rows of the concatenation held none of them,
    so the simulation never met what a real run's shuffle does."""
    from asyncrl.sim.runner import _rows as sim_rows

    short = _write_jsonl(tmp_path / "big1.jsonl", _rows("a", 50))
    long_rows = [{**r, "prompt": [{"role": "user", "content": "x " * 200 + r["prompt"][0]["content"]}]}
                 for r in _rows("b", 40)]
    long = _write_jsonl(tmp_path / "long2.jsonl", long_rows)
    cfg = load_config(None, [f"data.train_files=[{short},{long}]", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                             "async_training.require_batches=1"])
    train, _, _ = sim_rows(cfg, 40, None)
    want = [(_rows("a", 50) + long_rows)[i] for i in sorted(epoch_order(90, cfg.trainer.seed, 0)[:40])]
    assert _prompts(train) == _prompts(want)
    assert 0 < sum("(b)" in p for p in _prompts(train)) < 40
