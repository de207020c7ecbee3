"""A run on the user's own rows (``data.train_files=...``), as verl users start one: named after the data, not the
recipe (``arith_grpo_cpu__...`` trained on ``my_rows.jsonl`` said nothing of it), resumed by that name, and its
``config.yaml`` holding absolute data paths so it re-runs from any directory."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest

from asyncrl.config import ExperimentConfig, load_config, to_yaml
from asyncrl.config_data import resolve_data_paths
from asyncrl.data.dataset import get_task_rows
from asyncrl.recipes import arith_grpo_cpu, calc_tool_grpo_cpu, smoke_cpu


def _rows_file(path: Path, n: int = 64) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = get_task_rows("arith", "train", n, 3)
    path.write_text("".join(json.dumps({**r, "data_source": "my_sum"}) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("recipe, overrides, name", [
    (arith_grpo_cpu, ["data.train_files=my_rows.jsonl"], "my_rows_arith_grpo_cpu"),
    (arith_grpo_cpu, ["data.train_files=[my_rows.jsonl,more.parquet]"], "my_rows_arith_grpo_cpu"),  # the first file
    (arith_grpo_cpu, ["data.train_files=~/data/gsm8k/train.parquet"], "gsm8k_arith_grpo_cpu"),  # verl's layout: the dir
    (arith_grpo_cpu, ["+data.train_files=my rows (v2).jsonl"], "my_rows_v2_arith_grpo_cpu"),  # a directory name, a glob
    (calc_tool_grpo_cpu, ["data.train_files=tools.jsonl"], "tools_calc_tool_grpo_cpu"),  # the recipe's whole name
    (smoke_cpu, ["data.train_files=my_rows.jsonl"], "my_rows_smoke_mode_d"),  # the data first
    (arith_grpo_cpu, ["data.train_files=my_rows.jsonl", "trainer.experiment_name=mine"], "mine"),  # given: it wins
    (arith_grpo_cpu, ["trainer.experiment_name=arith_grpo_cpu", "data.train_files=my_rows.jsonl"], "arith_grpo_cpu"),
    (arith_grpo_cpu, ["data={train_files: my_rows.jsonl}", "trainer={experiment_name: mine}"], "mine"),
    (arith_grpo_cpu, ["data.val_files=my_rows.jsonl"], "arith_grpo_cpu"),  # trains on the task's rows
    (arith_grpo_cpu, ["data.train_files=null"], "arith_grpo_cpu"),
])
def test_a_run_on_its_own_data_is_named_after_the_train_file(recipe, overrides, name):
    assert load_config(overrides=overrides, base=recipe()).trainer.experiment_name == name


@pytest.mark.parametrize("recipe_name, train_files, name", [
    ("my/recipe[1]", "rows.jsonl", "rows_my_recipe_1_"),  # a recipe (or YAML) name with refused characters
    ("a*b_arith", "*.jsonl", "data_a_b_arith"),  # a data name of glob characters only
    ("", "../x/train.jsonl", "x"),  # the split file's directory; never empty
    ("arith_grpo", "C:\\d\\r?.jsonl", "C_d_r_arith_grpo"),
])
def test_a_name_derived_from_the_data_always_passes_the_experiment_name_check(recipe_name, train_files, name):
    from asyncrl.config import validate
    from asyncrl.config_data import data_experiment_name

    assert data_experiment_name(recipe_name, train_files) == name
    cfg = load_config()
    cfg.trainer.experiment_name = name
    validate(cfg)


@pytest.mark.parametrize("train_files", ["mytask/train.jsonl", "r" * 240 + ".jsonl"])
def test_every_recipe_on_the_same_data_names_its_own_run(train_files):
    """A fresh user's pass (session 33): ``asyncrl train data.train_files=mytask/train.jsonl`` and the same with
    ``--recipe longtail_grpo_cpu`` were both ``mytask_grpo_cpu`` (the task word replaced by the data name), and the
    second resumed the first's checkpoint (another model), appended to its metrics.csv and overwrote its config.yaml.
    Each recipe on one data file names a run of its own, different from the recipe's own runs."""
    from asyncrl.cli import _load_with_recipe
    from asyncrl.recipes import RECIPES

    names = {}
    for recipe_name in RECIPES:  # as `asyncrl train --recipe NAME data.train_files=...` builds them
        args = argparse.Namespace(recipe=recipe_name, overrides=[f"data.train_files={train_files}"])
        names[recipe_name] = _load_with_recipe(args)[0].trainer.experiment_name
    assert len(set(names.values())) == len(names), names
    assert not set(names.values()) & set(RECIPES), names
    assert names["arith_grpo_cpu"].endswith("_arith_grpo_cpu")
    assert names["longtail_grpo_cpu"].endswith("_longtail_grpo_cpu")


def test_a_name_derived_from_a_long_data_file_name_is_cut_to_fit_one_file_name(tmp_path):
    """A data file name of 240 characters made ``<240 characters>_grpo_cpu``: its run directory name passed the 255
    bytes a file name may hold. The data part is cut (the recipe's words kept) and ends in a digest of the whole."""
    from asyncrl.config_data import data_experiment_name
    from asyncrl.run_names import DERIVED_NAME_MAX, run_name

    long_a, long_b = "r" * 240 + "_a.jsonl", "r" * 240 + "_b.jsonl"
    cfg = load_config(overrides=[f"data.train_files={long_a}", f"trainer.default_local_dir={tmp_path}",
                                 "trainer.seed=4294967295"], base=arith_grpo_cpu())
    name = cfg.trainer.experiment_name
    assert len(name) == DERIVED_NAME_MAX == 226 and name.startswith("r" * 202 + "-")
    assert name.endswith("_arith_grpo_cpu")
    (tmp_path / run_name(name, cfg.trainer.seed)).mkdir()  # the file system takes it
    assert name != data_experiment_name("arith_grpo_cpu", long_b)  # two long names that begin alike
    assert data_experiment_name("smoke_mode_d", long_a).endswith("_smoke_mode_d")
    assert data_experiment_name("arith_grpo_cpu", "r" * 211 + ".jsonl") == "r" * 211 + "_arith_grpo_cpu"  # fits


@pytest.mark.parametrize("make", [arith_grpo_cpu, calc_tool_grpo_cpu, smoke_cpu, ExperimentConfig])
def test_train_files_set_by_attribute_name_the_run_as_the_command_line_does(make, tmp_path, monkeypatch):
    """``cfg.data.train_files = "my_rows.jsonl"`` on a recipe's config (the notebook's way) kept the recipe's name
    (``arith_grpo_cpu``: it shared, and ``resume_mode=auto`` resumed, the recipe's runs) where the override
    ``data.train_files=my_rows.jsonl`` names the run ``my_rows_arith_grpo_cpu``. Both now name it after the data."""
    from asyncrl.experiment import Experiment

    monkeypatch.chdir(tmp_path)
    _rows_file(tmp_path / "my_rows.jsonl")
    by_cli = load_config(overrides=["data.train_files=my_rows.jsonl"], base=make()).trainer.experiment_name
    cfg = make()
    cfg.data.train_files = "my_rows.jsonl"
    exp = Experiment(cfg)
    assert by_cli.startswith("my_rows_") and by_cli != make().trainer.experiment_name
    assert (exp.config.trainer.experiment_name, exp.name.rpartition("__")[0].rpartition("__")[0]) == (by_cli, by_cli)
    cfg = dataclasses.replace(make(), data=dataclasses.replace(make().data, train_files="my_rows.jsonl"))
    assert Experiment(cfg).config.trainer.experiment_name == by_cli
    cfg = load_config(base=make())  # through load_config first: a later attribute still renames it
    cfg.data.train_files = "more_rows.jsonl"
    _rows_file(tmp_path / "more_rows.jsonl")
    assert Experiment(cfg).config.trainer.experiment_name == by_cli.replace("my_rows_", "more_rows_", 1)
    assert load_config(base=cfg).trainer.experiment_name == by_cli.replace("my_rows_", "more_rows_", 1)
    cfg.data.train_files = None  # back to the task's rows: the recipe's name again
    assert Experiment(cfg).config.trainer.experiment_name == make().trainer.experiment_name


def test_an_experiment_keeps_its_own_config_when_the_callers_changes(tmp_path, monkeypatch):
    """A fresh user's pass (session 33): ``e1 = Experiment(cfg); cfg.data.train_files = "other.jsonl";
    Experiment(cfg)`` renamed ``e1.config``'s run (the same object) while ``e1.run_dir`` stayed. Each Experiment works
    on a copy: the caller's config is neither kept nor changed."""
    from asyncrl.experiment import Experiment

    monkeypatch.chdir(tmp_path)
    _rows_file(tmp_path / "my_rows.jsonl")
    _rows_file(tmp_path / "other.jsonl")
    cfg = arith_grpo_cpu()
    cfg.data.train_files = "my_rows.jsonl"
    e1 = Experiment(cfg)
    assert e1.config is not cfg and cfg.trainer.experiment_name == "arith_grpo_cpu"  # the caller's: untouched
    cfg.data.train_files = "other.jsonl"
    e2 = Experiment(cfg)
    assert (e1.config.trainer.experiment_name, e1.config.data.train_files) == ("my_rows_arith_grpo_cpu", "my_rows.jsonl")
    assert e1.run_dir.name.startswith("my_rows_arith_grpo_cpu__") and e2.run_dir.name.startswith("other_arith_grpo_cpu__")
    assert e2.config.trainer.experiment_name == "other_arith_grpo_cpu"


@pytest.mark.parametrize("name_first", [True, False])
def test_a_name_set_by_attribute_wins_over_the_data_as_an_override_does(name_first, tmp_path, monkeypatch):
    """As ``trainer.experiment_name=arith_grpo_cpu data.train_files=my_rows.jsonl`` keeps ``arith_grpo_cpu``: a name
    the user sets, the recipe's own included, in either order."""
    from asyncrl.experiment import Experiment

    monkeypatch.chdir(tmp_path)
    _rows_file(tmp_path / "my_rows.jsonl")
    for name in ("mine", "arith_grpo_cpu"):
        cfg = arith_grpo_cpu()
        if name_first:
            cfg.trainer.experiment_name = name
        cfg.data.train_files = "my_rows.jsonl"
        if not name_first:
            cfg.trainer.experiment_name = name
        assert Experiment(cfg).config.trainer.experiment_name == name
        assert load_config(base=cfg, overrides=["data.train_files=my_rows.jsonl"]).trainer.experiment_name == name


def test_a_yaml_file_names_the_run_as_overrides_do_and_a_run_directorys_config_keeps_its_name(tmp_path):
    (tmp_path / "own.yaml").write_text("data:\n  train_files: my_rows.jsonl\n")
    cfg = load_config(tmp_path / "own.yaml", base=arith_grpo_cpu())
    assert cfg.trainer.experiment_name == "my_rows_arith_grpo_cpu"
    (tmp_path / "named.yaml").write_text("data:\n  train_files: my_rows.jsonl\ntrainer:\n  experiment_name: mine\n")
    assert load_config(tmp_path / "named.yaml", base=arith_grpo_cpu()).trainer.experiment_name == "mine"
    cfg.data.train_files = "other.jsonl"  # a saved config.yaml names the run itself: re-run, it keeps its name
    (tmp_path / "config.yaml").write_text(to_yaml(cfg))
    assert load_config(tmp_path / "config.yaml").trainer.experiment_name == "my_rows_arith_grpo_cpu"


def test_dry_run_and_start_print_the_run_name_and_why(capsys, tmp_path, monkeypatch):
    from asyncrl.cli import main
    from asyncrl.experiment import Experiment

    monkeypatch.chdir(tmp_path)
    _rows_file(tmp_path / "my_rows.jsonl")
    assert main(["train", "--dry-run", "data.train_files=my_rows.jsonl", "custom_reward_function.path=r.py"]) == 2
    capsys.readouterr()
    (tmp_path / "r.py").write_text("def compute_score(**kw):\n    return 1.0\n")
    argv = ["train", "data.train_files=my_rows.jsonl", "custom_reward_function.path=r.py"]
    assert main(argv[:1] + ["--dry-run"] + argv[1:]) == 0
    out, err = capsys.readouterr()
    assert "experiment_name: my_rows_arith_grpo_cpu\n" in out
    assert ("run: runs/my_rows_arith_grpo_cpu__0__<start time>/ (trainer.experiment_name=my_rows_arith_grpo_cpu: named after "
            "data.train_files and the recipe arith_grpo_cpu; trainer.experiment_name=... names it)") in err.splitlines()
    assert main(argv[:1] + ["--dry-run"] + argv[1:] + ["trainer.experiment_name=mine"]) == 0
    assert "run: runs/mine__0__<start time>/ (trainer.experiment_name=mine)" in capsys.readouterr().err.splitlines()

    def start(self):  # a fake start: the actors are up (a real one takes ~1 min); then Ctrl-C
        return self

    def wait(self):
        raise KeyboardInterrupt
    monkeypatch.setattr(Experiment, "start", start)
    monkeypatch.setattr(Experiment, "wait", wait)
    monkeypatch.setattr(Experiment, "stop", lambda self: None)
    assert main(argv) == 130
    first = capsys.readouterr().err.splitlines()[0]  # once started: an error before the start stays its one line
    assert first.startswith("run: runs/my_rows_arith_grpo_cpu__0__2") and first.endswith(
        "/ (trainer.experiment_name=my_rows_arith_grpo_cpu: named after data.train_files and the recipe arith_grpo_cpu; "
        "trainer.experiment_name=... names it)"), first


def test_resume_mode_auto_finds_the_run_named_after_the_data(capsys, tmp_path, monkeypatch):
    """``trainer.resume_mode=auto`` (the default) looks for ``<experiment_name>__<seed>__*``: the same command on the
    same data derives the same name and resumes the run; a run of the recipe's name on that data is not this run's."""
    from asyncrl.checkpoint import CheckpointManager
    from asyncrl.cli import main
    from asyncrl.data.dataset import train_source
    from asyncrl.experiment import Experiment

    monkeypatch.chdir(tmp_path)
    _rows_file(tmp_path / "my_rows.jsonl")
    overrides = ["data.train_files=my_rows.jsonl", "trainer.default_local_dir=runs"]
    cfg = load_config(overrides=overrides, base=arith_grpo_cpu())

    def checkpoint(run: str, step: int) -> Path:
        def write(d):
            (d / "rollouter_state.json").write_text(json.dumps({"position": {"source": train_source(cfg.data)}}))
        return CheckpointManager(Path("runs") / run / "checkpoints").save(step, write)

    assert Experiment(cfg).resume_from is None
    ckpt = checkpoint("my_rows_arith_grpo_cpu__0__20260101-000000", 3)
    checkpoint("arith_grpo_cpu__0__20260102-000000", 5)  # the recipe's name: another run, though newer
    exp = Experiment(load_config(overrides=overrides, base=arith_grpo_cpu()))
    assert (exp.resume_from, exp.name) == (ckpt, "my_rows_arith_grpo_cpu__0__20260101-000000")
    (tmp_path / "config.yaml").write_text(to_yaml(cfg))  # the run directory's config.yaml resumes it too
    assert Experiment(load_config(tmp_path / "config.yaml")).resume_from == ckpt
    (tmp_path / "r.py").write_text("def compute_score(**kw):\n    return 1.0\n")
    assert main(["train", "--dry-run", *overrides, "custom_reward_function.path=r.py"]) == 0
    err = capsys.readouterr().err
    assert f"would resume from {ckpt}" in err, err
    assert f"run: runs/my_rows_arith_grpo_cpu__0__20260101-000000/ (trainer.experiment_name=my_rows_arith_grpo_cpu: named after " \
           "data.train_files and the recipe arith_grpo_cpu; trainer.experiment_name=... names it); resuming " \
           "global_step_3" in err.splitlines(), err


def test_relative_data_paths_are_made_absolute_and_the_saved_config_reruns_from_another_directory(tmp_path,
                                                                                                 monkeypatch):
    """``config.yaml`` of a run directory kept ``data.train_files`` (and ``trainer.default_local_dir``) as typed
    (relative) while ``custom_reward_function.path`` was made absolute: re-run from elsewhere, it read no data (or
    other data), and wrote to ``<elsewhere>/runs`` where ``resume_mode=auto`` found none of the run's checkpoints."""
    from asyncrl.run_paths import resolve_run_paths
    from asyncrl.experiment import Experiment

    work = tmp_path / "project"
    _rows_file(work / "mytask" / "train.jsonl")
    _rows_file(work / "mytask" / "test.jsonl", 8)
    (work / "mytask" / "reward.py").write_text("def compute_score(**kw):\n    return 1.0\n")
    monkeypatch.chdir(work)
    cfg = load_config(overrides=["data.train_files=mytask/train.jsonl", "data.val_files=[./mytask/test.jsonl]",
                                 "custom_reward_function.path=mytask/reward.py"])
    before = Experiment(cfg).run_dir.absolute()
    resolve_run_paths(cfg)  # as Experiment.start does, before config.yaml is written
    assert (cfg.data.train_files, cfg.data.val_files) == (str(work / "mytask/train.jsonl"),
                                                          str(work / "mytask/test.jsonl"))
    assert cfg.trainer.default_local_dir == str(work / "runs")  # where the run writes, unchanged
    assert Experiment(cfg).run_dir.parent == before.parent
    (tmp_path / "config.yaml").write_text(to_yaml(cfg))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    again = load_config(tmp_path / "config.yaml")
    train, val = Experiment(again).preflight()  # reads the rows and loads the reward as a run would
    assert (len(train), len(val), again.trainer.experiment_name) == (64, 8, "mytask_arith_grpo_cpu")
    assert again.trainer.default_local_dir == str(work / "runs")  # not <elsewhere>/runs


def test_resolve_data_paths_takes_each_file_of_a_list_and_expands_home(tmp_path, monkeypatch):
    from asyncrl.config import ExperimentConfig

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    data = ExperimentConfig().data
    data.train_files, data.val_files = ["a.jsonl", "~/b.parquet", "/abs/c.jsonl"], None
    resolve_data_paths(data)
    assert (data.train_files, data.val_files) == (
        [str(tmp_path / "a.jsonl"), str(tmp_path / "home" / "b.parquet"), "/abs/c.jsonl"], None)


def test_dry_run_prints_absolute_paths_takes_a_leading_tilde_key_and_expands_home_in_the_run_directory(
        tmp_path, monkeypatch, capsys):
    """A fresh user's re-check (session 32): ``--dry-run > resolved.yaml`` kept relative data / reward / run paths
    (only a real run's config.yaml was absolute), so it did not re-run from another directory; a ``~key`` written
    first after ``train`` was read as a config file's name; ``trainer.default_local_dir=~/runs`` (the shell does not
    expand ~ after a dotted key) became ``<cwd>/~/runs``; an unclosed ``${`` was an OmegaConf traceback."""
    import yaml

    from asyncrl.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    code = main(["train", "--dry-run", "~trainer.total_training_steps", "trainer.default_local_dir=~/runs"])
    out, err = capsys.readouterr()
    assert code == 0, err
    printed = yaml.safe_load(out)
    assert printed["trainer"]["default_local_dir"] == str(tmp_path / "home" / "runs")
    assert f"run: {tmp_path / 'home' / 'runs'}/" in err, err
    assert main(["train", "--dry-run", "trainer.experiment_name=run${x"]) == 2
    err = capsys.readouterr().err
    assert "holds a '${' that starts no complete interpolation" in err and "Traceback" not in err, err


@pytest.mark.parametrize("train_files, data", [
    ("données.jsonl", "données"),  # was donn_es
    ("数据.jsonl", "数据"),  # was data, as every CJK name
    ("数据2.jsonl", "数据2"),
    ("donne\u0301es.jsonl", "données"),  # decomposed (macOS): the same name as typed
    ("~/data/résumé/train.parquet", "résumé"),
    ("a b\t*c?[d].jsonl", "a_b_c_d"),  # whitespace and glob characters still become _
    ("x/\u3000y.jsonl", "y"),  # an ideographic space
])
def test_a_data_file_named_in_another_script_keeps_its_letters_in_the_run_name(train_files, data):
    """A fresh user's pass (session 33): ``données.jsonl`` named ``donn_es_grpo_cpu``, and every CJK-named file
    ``data_grpo_cpu`` (two data sets, one run name, ``resume_mode=auto`` across them). Unicode letters and digits stay;
    the name still passes ``trainer.experiment_name``'s check."""
    from asyncrl.config import validate
    from asyncrl.config_data import data_name, name_after_data

    assert data_name(train_files) == data
    cfg = arith_grpo_cpu()
    cfg.data.train_files = train_files
    name_after_data(cfg)
    assert cfg.trainer.experiment_name.startswith(f"{data}_")
    validate(cfg)


def test_a_data_file_name_with_a_byte_that_is_not_utf8_names_no_run_and_is_refused():
    """The name drops the byte (``x/<0xff> y.jsonl`` is ``y``); the config is refused all the same, with the link to
    make (tests/test_config_data_files.py): a run writes config.yaml as UTF-8, and pyarrow cannot open such a path."""
    from asyncrl.config import ConfigError, validate
    from asyncrl.config_data import data_name, name_after_data

    assert data_name("x/\udcff\u3000y.jsonl") == "y"
    cfg = arith_grpo_cpu()
    cfg.data.train_files = "x/\udcff\u3000y.jsonl"
    name_after_data(cfg)
    assert cfg.trainer.experiment_name == "y_arith_grpo_cpu"
    with pytest.raises(ConfigError, match=r"^data.train_files=x/\\xff\u3000y.jsonl is not UTF-8 text"):
        validate(cfg)


@pytest.mark.parametrize("char", ["é", "数", "𝟘"])  # 2, 3, 4 bytes in UTF-8
def test_a_long_non_ascii_data_name_is_cut_in_bytes_at_a_character_boundary(char, tmp_path):
    """The cut to :data:`~asyncrl.run_names.DERIVED_NAME_MAX` counted characters (one byte each, when names were
    ASCII): 200 CJK characters are 600 bytes, past the 255 a file name holds."""
    from asyncrl.config_data import data_experiment_name
    from asyncrl.run_names import DERIVED_NAME_MAX, run_name

    name = data_experiment_name("arith_grpo_cpu", char * 200 + ".jsonl")
    assert DERIVED_NAME_MAX - 4 < len(name.encode()) <= DERIVED_NAME_MAX
    assert name.startswith(char * 10) and name.endswith("_arith_grpo_cpu") and name.encode().decode() == name
    assert name != data_experiment_name("arith_grpo_cpu", char * 201 + ".jsonl")
    (tmp_path / run_name(name, 2**32 - 1)).mkdir()  # the file system takes it


def test_dry_run_shows_that_a_run_of_another_model_is_not_resumed(capsys, caplog, tmp_path, monkeypatch):
    """Two recipes given one ``trainer.experiment_name`` share run directories; ``--dry-run``'s "would resume from"
    is the decision a run makes: the arith recipe's checkpoint is resumed by the arith recipe only (its config.yaml
    records the model and task), not by ``--recipe longtail_grpo_cpu`` (another model)."""
    from asyncrl.checkpoint import CheckpointManager
    from asyncrl.cli import main
    from asyncrl.data.dataset import train_source

    monkeypatch.chdir(tmp_path)
    _rows_file(tmp_path / "my_rows.jsonl")
    (tmp_path / "r.py").write_text("def compute_score(**kw):\n    return 1.0\n")
    argv = ["train", "--dry-run", "data.train_files=my_rows.jsonl", "custom_reward_function.path=r.py",
            "trainer.experiment_name=shared"]
    cfg = load_config(overrides=argv[2:], base=arith_grpo_cpu())
    def write(d: Path) -> None:  # what write_checkpoint writes that the lookup and the dry run read
        (d / "config.yaml").write_text(to_yaml(cfg))
        (d / "rollouter_state.json").write_text(json.dumps({"position": {"source": train_source(cfg.data)}}))

    ckpt = CheckpointManager(Path("runs/shared__0__20260101-000000/checkpoints")).save(3, write)
    assert main(argv) == 0
    assert f"would resume from {ckpt}" in capsys.readouterr().err
    assert main(argv[:2] + ["--recipe", "longtail_grpo_cpu"] + argv[2:]) == 0
    err = capsys.readouterr().err
    assert "would resume from" not in err and "; resuming" not in err, err
    assert "not resuming runs/shared__0__20260101-000000/checkpoints/global_step_3: its run used " \
           "actor_rollout_ref.model.path=" in caplog.text  # the WARNING (on stderr, through logging, outside pytest)
    assert "run: runs/shared__0__<start time>/" in err, err


def test_local_model_paths_are_made_absolute_and_a_hub_name_is_kept(tmp_path, monkeypatch, capsys):
    """A session-34 tester's finding: ``actor_rollout_ref.model.path=m1moved`` stayed relative in the resolved config
    (``--dry-run``'s YAML, a run's config.yaml), so ``asyncrl train <that>.yaml`` from another directory failed with
    "no such directory", against the README. A local model, tokenizer or critic directory is made absolute where the
    data paths are, and so are the other local paths (resume_from_path, the sandbox's trials_dir and harbor_python);
    a hub-style name that is no local directory is kept as typed, for what reads it."""
    import shutil

    import yaml

    from asyncrl.cli import main
    from asyncrl.models import EMBEDDED_MODEL_DIR
    from asyncrl.run_paths import local_model_path, resolve_run_paths

    work = tmp_path / "models"
    work.mkdir()
    shutil.copytree(EMBEDDED_MODEL_DIR, work / "m1")
    monkeypatch.chdir(work)
    argv = ["train", "--dry-run", "actor_rollout_ref.model.path=m1", "actor_rollout_ref.model.tokenizer_path=./m1",
            f"trainer.default_local_dir={tmp_path / 'runs'}", "trainer.experiment_name=rel"]
    assert main(argv) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["actor_rollout_ref"]["model"]["path"] == str(work / "m1")
    assert printed["actor_rollout_ref"]["model"]["tokenizer_path"] == str(work / "m1")
    (tmp_path / "rel.yaml").write_text(yaml.safe_dump(printed))
    monkeypatch.chdir(tmp_path)  # elsewhere: the printed config runs as it is
    assert main(["train", "--dry-run", str(tmp_path / "rel.yaml")]) == 0, capsys.readouterr().err
    capsys.readouterr()
    monkeypatch.chdir(work)
    cfg = ExperimentConfig()
    sandbox = cfg.actor_rollout_ref.rollout.agent.sandbox
    cfg.actor_rollout_ref.model.path, cfg.critic.model.path = "Qwen/Qwen2.5-0.5B", "m1"
    cfg.trainer.resume_from_path, sandbox.trials_dir, sandbox.harbor_python = "runs/x/ckpt", "trials", "py/bin/python"
    resolve_run_paths(cfg)
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-0.5B"  # no local directory: a hub name, kept
    assert cfg.actor_rollout_ref.model.tokenizer_path is None
    assert cfg.critic.model.path == str(work / "m1")
    assert (cfg.trainer.resume_from_path, sandbox.trials_dir, sandbox.harbor_python) == (
        str(work / "runs/x/ckpt"), str(work / "trials"), str(work / "py/bin/python"))  # local whatever they hold
    (work / "Qwen" / "Qwen2.5-0.5B").mkdir(parents=True)  # a local directory of that name: the local one
    assert local_model_path("Qwen/Qwen2.5-0.5B") == str(work / "Qwen" / "Qwen2.5-0.5B")
    assert (local_model_path(None), local_model_path("")) == (None, "")
