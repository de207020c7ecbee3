"""``data.train_files`` / ``data.val_files`` as verl's list of files, read one after the other.

The schema typed them ``Optional[str]``: a one-element list was taken as its path, a longer one refused ("a list of
2 files is not supported yet: concatenate them into one file"), though verl's ``RLHFDataset`` concatenates them.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pandas as pd
import pytest

from asyncrl.config import ConfigError, ExperimentConfig, load_config
from asyncrl.data.dataset import DatasetNotFoundError, run_rows
from asyncrl.data.sampler import epoch_order


def _rows(prefix: str, n: int) -> list[dict]:
    return [{"data_source": "arith", "prompt": [{"role": "user", "content": f"what is {i} + 1? ({prefix})"}],
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)}, "extra_info": {"index": i}}
            for i in range(n)]


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _write_parquet(path: Path, rows: list[dict]) -> str:
    pd.DataFrame(rows).to_parquet(path)
    return str(path)


def _prompts(rows: list[dict]) -> list[str]:
    return [r["prompt"][0]["content"] for r in rows]


def test_a_list_of_files_is_read_in_order_from_overrides_and_yaml(tmp_path):
    a = _write_jsonl(tmp_path / "a.jsonl", _rows("a", 3))
    b = _write_parquet(tmp_path / "b.parquet", _rows("b", 2))
    want = _prompts(_rows("a", 3) + _rows("b", 2))
    cfg = load_config(None, [f"data.train_files=[{a},{b}]", f"data.val_files=[{b},{a}]"])
    assert cfg.data.train_files == [a, b]
    assert _prompts(run_rows(cfg.data, "train", 0)) == want
    assert _prompts(run_rows(cfg.data, "test", 0)) == _prompts(_rows("b", 2) + _rows("a", 3))
    # a limit (the simulator's max_rows) takes the rows a run's first epoch takes first, from every file
    assert _prompts(run_rows(cfg.data, "train", 0, limit=4)) == [want[i] for i in sorted(epoch_order(5, 0, 0)[:4])]
    yml = tmp_path / "c.yaml"
    yml.write_text(f"data:\n  train_files:\n    - {b}\n    - {a}\n")
    assert _prompts(run_rows(load_config(yml).data, "train", 0)) == _prompts(_rows("b", 2) + _rows("a", 3))
    # an override replaces the YAML's list, either way
    assert load_config(yml, [f"data.train_files={a}"]).data.train_files == a
    assert load_config(yml, [f"data.train_files=[{a},{a}]"]).data.train_files == [a, a]


def test_a_plain_path_and_a_one_element_list_stay_a_path(tmp_path):
    a = _write_jsonl(tmp_path / "a.jsonl", _rows("a", 3))
    for value in (a, f"[{a}]"):
        cfg = load_config(None, [f"data.train_files={value}"])
        assert cfg.data.train_files == a
        assert _prompts(run_rows(cfg.data, "train", 0)) == _prompts(_rows("a", 3))


def test_a_python_list_of_paths_as_base(tmp_path):
    a = _write_jsonl(tmp_path / "a.jsonl", _rows("a", 2))
    b = _write_jsonl(tmp_path / "b.jsonl", _rows("b", 2))
    base = ExperimentConfig()
    base.data.train_files = [Path(a), b]
    cfg = load_config(base=base)
    assert cfg.data.train_files == [a, b] and base.data.train_files == [Path(a), b]  # the caller's object as it was
    assert _prompts(run_rows(cfg.data, "train", 0)) == _prompts(_rows("a", 2) + _rows("b", 2))


def test_a_missing_file_of_a_list_is_named(tmp_path):
    a = _write_jsonl(tmp_path / "a.jsonl", _rows("a", 2))
    missing = tmp_path / "nope.parquet"
    cfg = load_config(None, [f"data.train_files=[{a},{missing}]"])  # files are checked where read, not at load
    with pytest.raises(DatasetNotFoundError, match=rf"^dataset file not found: {missing} \(data.train_files\[1\], "
                                                   r"file 2 of 2\)$"):
        run_rows(cfg.data, "train", 0)
    cfg = load_config(None, [f"data.val_files=[{missing},{a}]"])
    with pytest.raises(DatasetNotFoundError, match=r"\(data.val_files\[0\], file 1 of 2\)$"):
        run_rows(cfg.data, "test", 0)
    cfg = load_config(None, [f"data.train_files={missing}"])  # one path: named with its key, no position
    with pytest.raises(DatasetNotFoundError, match=rf"^dataset file not found: {missing} \(data.train_files\)$"):
        run_rows(cfg.data, "train", 0)


@pytest.mark.parametrize("override, says", [
    ("data.train_files=[]", r"data.train_files=\[\] names no file: give one or more files, or null"),
    ("data.val_files=[a.jsonl,'']", r"data.val_files\[1\] is an empty path"),
    ("data.train_files=[1,2]", r"invalid value for 'data.train_files'"),
])
def test_a_list_naming_no_file_is_refused(override, says):
    with pytest.raises(ConfigError, match=says):
        load_config(None, [override])


def test_cli_dry_run_and_sim_take_a_list(tmp_path, capsys):
    from asyncrl.cli import main

    rows = _rows("x", 64)
    a = _write_jsonl(tmp_path / "a.jsonl", rows[:32])
    b = _write_parquet(tmp_path / "b.parquet", rows[32:])
    assert main(["train", "--dry-run", f"data.train_files=[{a},{b}]", "trainer.total_training_steps=2"]) == 0
    out, err = capsys.readouterr()
    assert "config ok" in err, err
    saved = tmp_path / "resolved.yaml"
    saved.write_text(out)
    assert load_config(saved).data.train_files == [a, b]  # the resolved YAML reads back as the list
    missing = tmp_path / "gone.jsonl"
    assert main(["train", "--dry-run", f"data.train_files=[{a},{missing}]"]) == 2
    assert capsys.readouterr().err.strip() == (f"dataset error: dataset file not found: {missing} "
                                               "(data.train_files[1], file 2 of 2)")
    assert main(["sim", f"data.train_files=[{a},{b}]", "trainer.total_training_steps=2", "trainer.total_time_s=0"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("override", ["data.train_files=", "data.train_files=  "])
def test_an_empty_override_is_the_empty_string_as_in_hydra(override):
    """A fresh user's case (session 25): ``data.train_files=$TRAIN`` with ``TRAIN`` unset read as YAML's null and
    trained on the built-in task without a word. ``key=`` is the empty string, as Hydra (verl) reads it."""
    from asyncrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"data.train_files='' is an empty path"):
        load_config(overrides=[override])
    assert load_config(overrides=["trainer.omp_wait_policy="]).trainer.omp_wait_policy == ""
    with pytest.raises(ConfigError, match=r"invalid value for 'trainer.total_training_steps' in override "
                                          r"'trainer.total_training_steps=': '' is not int$"):
        load_config(overrides=["trainer.total_training_steps="])


@pytest.mark.parametrize("value", ["{p}", "'{p}'", "[a.jsonl, {p}]"])
def test_a_data_file_name_that_is_not_utf8_is_a_config_error(value):
    """A name with the byte 0xff, as ``sys.argv`` holds it (``surrogateescape``): the quoted form crashed the override
    parser (UnicodeEncodeError from YAML), the others a run's config.yaml; a value set from Python is refused too."""
    from asyncrl.recipes import arith_grpo_cpu

    p = os.fsdecode(b"/data/x\xff.parquet")
    with pytest.raises(ConfigError, match=r"^data.train_files=.*/data/x\\xff.parquet.* in an override is not UTF-8 "
                                          r"text \(the byte \\xff, .*rename the file to a UTF-8 name, or link one to it "
                                          r"\(ln -s \$'/data/x\\xff.parquet' '/data/x_.parquet'\) and give that$"):
        load_config(overrides=["data.train_files=" + value.format(p=p)])
    base = arith_grpo_cpu()
    base.data.val_files = p
    with pytest.raises(ConfigError, match=r"^data.val_files=/data/x\\xff.parquet is not UTF-8 text"):
        load_config(base=base)
    with pytest.raises(ConfigError, match=r"^trainer.experiment_name=run\\xfe in an override is not UTF-8 text .*; "
                                          r"write it in UTF-8$"):
        load_config(overrides=[os.fsdecode(b"trainer.experiment_name=run\xfe")])


@pytest.mark.parametrize("override, key", [
    (b"custom_reward_function.reward_kwargs.m\xff=x", r"custom_reward_function.reward_kwargs.m\xff"),
    (b"+custom_reward_function.reward_kwargs.m\xff=x", r"custom_reward_function.reward_kwargs.m\xff"),
    (b"trainer.se\xfeed=1", r"trainer.se\xfeed"),  # an unknown key too: not UTF-8 before unknown
])
def test_a_key_that_is_not_utf8_is_a_config_error_as_a_value_is(override, key, tmp_path, capsys):
    """A session-34 tester's finding: the non-UTF-8 check covered override values, not keys:
    ``custom_reward_function.reward_kwargs.m<0xff>=x`` passed, then ``--dry-run`` crashed printing the YAML
    (UnicodeEncodeError, exit 1), as a run's config.yaml would. A key is refused as a value is, from Python too."""
    from asyncrl.cli import main
    from asyncrl.recipes import arith_grpo_cpu

    reward = tmp_path / "r.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n    return 0\n")
    says = re.escape(f"the key {key} in an override is not UTF-8 text (the byte ") + r"\\x[0-9a-f]{2}" + re.escape(
        ", passed on as typed or as a file name holds it): a run writes its config as UTF-8 text (config.yaml in the "
        "run directory, --dry-run's listing), which cannot hold it; write the key in UTF-8")
    argv = [f"custom_reward_function.path={reward}", os.fsdecode(override)]
    with pytest.raises(ConfigError, match=f"^{says}$"):
        load_config(overrides=argv)
    assert main(["train", "--dry-run", *argv]) == 2
    assert re.fullmatch(f"config error: {says}", capsys.readouterr().err.strip().splitlines()[-1])
    base = arith_grpo_cpu()  # set from Python, in a mapping at any depth
    base.custom_reward_function.path = str(reward)
    base.custom_reward_function.reward_kwargs = {"a": {os.fsdecode(b"m\xff"): 1}}
    with pytest.raises(ConfigError, match=r"^the key custom_reward_function.reward_kwargs.a.m\\xff is not UTF-8 text "):
        load_config(base=base)
