"""The CLI's user errors have one style (issue 13 item 11), and batch parameters keep their types and
must be declared by the notebook (items 6 and 9).

Every user error prints ``<kind> error: <message>`` on stderr and exits 2 before Ray, an engine or a
kernel starts; the parameter tests use papermill's real parameter injection.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.batch_params import BatchParameterError, check_parameters, declared_parameters, parse_value, to_papermill
from asyncrl.cli import main

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "01_four_modes.ipynb"


def run_cli(capsys, *argv):
    code = main(list(argv))
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize("argv, want", [
    (["train", "async_training.staleness_treshold=0.5"],
     "config error: unknown config key 'async_training.staleness_treshold' in override "
     "'async_training.staleness_treshold=0.5'; did you mean 'async_training.staleness_threshold'?"),
    (["train", "task=arithh"], "config error: data.task='arithh' is not valid: unknown task 'arithh'; valid names: "),
    (["train", "--recipe", "nope"], "config error: unknown recipe 'nope'; known: "),
    (["train", "missing.yaml"], "config error: no config file 'missing.yaml'"),
    (["train", "actor_rollout_ref.rollout.name=vlm"],
     "config error: actor_rollout_ref.rollout.name='vlm' is not valid: unknown rollout backend 'vlm'; "
     "valid names: hf, vllm; did you mean 'vllm'?"),
    (["train", "actor_rollout_ref.rollout.agent.default_agent_loop=tool"],
     "config error: actor_rollout_ref.rollout.agent.default_agent_loop='tool' is not valid: unknown agent loop 'tool'"),
    # a section given a value (OmegaConf's own words: 'invalid value for "override ..." ...: None'), session 30
    (["train", "trainer=1"], "config error: 'trainer' in override 'trainer=1' is a config section, not a value: set a "
                             "key inside it, e.g. trainer.total_training_steps=... (trainer holds: total_training_steps, "),
    (["train", "actor_rollout_ref.rollout=[1]"], "config error: 'actor_rollout_ref.rollout' in override "
                                                 "'actor_rollout_ref.rollout=[1]' is a config section, not a value"),
    # a key close to nothing gets no guess (it was 'did you mean rollout?' for foo, a section one cannot set)
    (["train", "foo=1"], "config error: unknown config key 'foo' in override 'foo=1'; the config's top-level sections "
                         "are data, actor_rollout_ref, async_training, algorithm, critic, reward_model, "
                         "custom_reward_function, trainer, rollout, ray"),
    (["train", "trainer.fooo=1"], "config error: unknown config key 'trainer.fooo' in override 'trainer.fooo=1'; "
                                  "trainer holds: total_training_steps, total_time_s, "),
    (["train", "actor_rollout_ref.rolout.n=2"], "config error: unknown config key 'actor_rollout_ref.rolout' in override "
                                                "'actor_rollout_ref.rolout.n=2'; did you mean 'actor_rollout_ref.rollout'?"),
    (["train", "=5"], "config error: override '=5' is not of the form key=value (its key is empty)"),  # OmegaConf's text
    # session 30: each of these was accepted and ignored without a word
    (["train", "trainer.omp_wait_policy=x"], "config error: trainer.omp_wait_policy='x' is not valid; valid values: "
                                             "active, passive, "),
    (["train", "trainer.resume_from_path=/tmp/nope"], "config error: trainer.resume_from_path='/tmp/nope' is read only "
                                                      "with trainer.resume_mode=resume_path (it is 'auto')"),
    (["train", "trainer=null"], "config error: 'trainer' in override 'trainer=null' is a config section, not a value "
                                "(here null: nothing under it)"),
])
def test_config_errors(capsys, argv, want):
    code, err = run_cli(capsys, *argv)
    assert code == 2 and err.startswith(want), err
    assert "Traceback" not in err


def test_dataset_errors_look_like_config_errors(capsys, tmp_path):
    import ray

    ray_before = ray.is_initialized()  # another test of the session may have started one
    code, err = run_cli(capsys, "train", f"data.train_files={tmp_path / 'nope.jsonl'}")
    assert (code, err.strip()) == (2, f"dataset error: dataset file not found: {tmp_path / 'nope.jsonl'} "
                                   "(data.train_files)")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"data_source": "arith", "prompt": [{"role": "user", "content": "1+1"}]}) + "\n")
    code, err = run_cli(capsys, "train", f"data.train_files={bad}")
    assert code == 2 and err.startswith(f"dataset error: {bad}") and "reward_model" in err
    assert ray.is_initialized() == ray_before  # refused before anything started


def test_a_data_source_with_no_reward_is_a_dataset_error_unless_a_custom_reward_scores_every_row(capsys, tmp_path,
                                                                                                   monkeypatch):
    """``data_source: my_task`` trained on the gsm8k scorer's rewards, with a WARNING in an actor's log; now
    ``--dry-run`` (and a run, before anything starts) refuses it, naming file, row and key, unless verl's
    ``custom_reward_function`` scores every row; a reward registered in this process never reaches the actors."""
    import ray

    from asyncrl.reward import REWARD_FNS

    rows = [{"data_source": "arith" if i != 5 else "my_task", "prompt": f"what is {i} + 1?",
             "reward_model": {"ground_truth": str(i + 1)}} for i in range(64)]
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ray_before = ray.is_initialized()
    code, err = run_cli(capsys, "train", "--dry-run", f"data.train_files={data}")
    assert (code, err.strip()) == (2, (
        f"dataset error: {data}: data_source 'my_task' (row 5) has no reward function (known: arith, calc_tool, gsm8k, "
        "longtail, openai/gsm8k, word_problems); name a known one (gsm8k: the number after the last '####'), or set "
        "custom_reward_function.path to a .py file whose compute_score(data_source, solution_str, ground_truth, "
        "extra_info) scores every row (data.train_files)"))
    code, err = run_cli(capsys, "train", f"data.train_files={data}")  # a run refuses it before anything starts
    assert code == 2 and err.startswith(f"dataset error: {data}: data_source 'my_task' (row 5) has no reward function")
    monkeypatch.setitem(REWARD_FNS, "my_task", lambda s, gt: 1.0)  # register_reward("my_task", ...), undone after
    code, err = run_cli(capsys, "train", "--dry-run", f"data.train_files={data}")
    assert code == 2 and err.startswith(f"dataset error: {data}: data_source 'my_task' (row 5) has a reward function "
                                        "registered in this process only (asyncrl.reward.register_reward): the Ray "
                                        "actors that score a run never see it; set custom_reward_function.path"), err
    reward = tmp_path / "my_reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    assert main(["train", "--dry-run", f"data.train_files={data}", f"custom_reward_function.path={reward}"]) == 0
    err = capsys.readouterr().err
    assert "config ok (64 training prompts)" in err
    # which held-out rows a run evaluates: none without data.val_files (not data.task's generated rows, session 31)
    assert err.strip().splitlines()[-1] == ("held-out rows: none: data.val_files unset: no held-out evaluation (set "
                                            "data.val_files=... to evaluate held-out rows)"), err
    assert main(["train", "--dry-run", f"data.train_files={data}", f"data.val_files={data}",
                 f"custom_reward_function.path={reward}"]) == 0
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"held-out rows: 64 from data.val_files={data}"
    # the other way round (session 31's second fresh user): trained on the generated task without a word
    assert main(["train", "--dry-run", f"data.val_files={data}", f"custom_reward_function.path={reward}"]) == 0
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "note: data.val_files is set but data.train_files is not: training on the rows data.task=arith generates, "
        "evaluating on data.val_files (set data.train_files=... to train on your own rows)")
    code, err = run_cli(capsys, "train", "--dry-run", f"custom_reward_function.path={tmp_path / 'nope.py'}")
    assert (code, err.strip()) == (2, f"config error: custom_reward_function.path='{tmp_path / 'nope.py'}': no such "
                                      "file (a .py file defining compute_score(data_source, solution_str, ground_truth, "
                                      "extra_info))")
    assert ray.is_initialized() == ray_before


def test_dry_run_refuses_a_reward_function_verl_could_not_call_and_a_name_without_a_path(capsys, tmp_path, monkeypatch):
    """``def compute_score(solution, truth)`` said "config ok" and failed 128 groups 40 s into the run; a
    ``custom_reward_function.name`` without a path was ignored; a folder said "no such file"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mytask").mkdir()
    (tmp_path / "mytask" / "x.py").write_text("def compute_score(solution, truth):\n    return 1.0\n")
    code, err = run_cli(capsys, "train", "--dry-run", "custom_reward_function.path=mytask/x.py")
    assert (code, err.strip()) == (2, "config error: custom_reward_function.name='compute_score': mytask/x.py:"
                                      "compute_score(solution, truth) cannot be called as verl calls it (missing a "
                                      "required argument: 'solution'): it must accept the keywords data_source, "
                                      "solution_str, ground_truth, extra_info (rename its parameters to these, or add "
                                      "**kwargs)")
    code, err = run_cli(capsys, "train", "--dry-run", "custom_reward_function.path=mytask")
    assert (code, err.strip()) == (2, f"config error: custom_reward_function.path='mytask' is a directory (resolved "
                                      f"against {tmp_path}): give the .py file in it that defines compute_score("
                                      "data_source, solution_str, ground_truth, extra_info)")
    code, err = run_cli(capsys, "train", "--dry-run", "custom_reward_function.name=my_fn")
    assert (code, err.strip()) == (2, "config error: custom_reward_function.name='my_fn' is set without "
                                      "custom_reward_function.path, so nothing would call it (each row is scored by "
                                      "the rule reward of its data_source): set custom_reward_function.path to the .py "
                                      "file that defines my_fn, or drop the name")


def test_a_reward_files_import_side_effects_leave_dry_runs_yaml_and_exit_status_alone(capsys, tmp_path, monkeypatch):
    """A ``print`` at a reward file's import went to stdout, so ``asyncrl train --dry-run ... > resolved.yaml`` was no
    longer YAML; a ``raise SystemExit(0)`` at import ended ``--dry-run`` with status 0 and no output."""
    from asyncrl.config import load_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "noisy.py").write_text("print('loading my reward')\n"
                                       "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                                       "    return 1.0\n")
    assert main(["train", "--dry-run", "custom_reward_function.path=noisy.py"]) == 0
    out, err = capsys.readouterr()
    assert "loading my reward" in err and "loading my reward" not in out
    (tmp_path / "resolved.yaml").write_text(out)
    assert load_config(tmp_path / "resolved.yaml").custom_reward_function.path == str(tmp_path / "noisy.py")  # absolute
    (tmp_path / "script.py").write_text("import sys\nsys.exit(0)\n")
    code, err = run_cli(capsys, "train", "--dry-run", "custom_reward_function.path=script.py")
    assert (code, err.strip()) == (2, "config error: custom_reward_function.path='script.py' failed to import: "
                                      "SystemExit: 0 (the file is imported, not run as a script: move that code "
                                      "under if __name__ == '__main__':)")


def test_dataset_error_in_a_subprocess_has_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "asyncrl.cli", "train", f"data.train_files={tmp_path / 'x.parquet'}"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("dataset error: ")
    assert "Traceback" not in proc.stderr


def test_batch_errors(capsys, tmp_path):
    code, err = run_cli(capsys, "batch", str(tmp_path / "none.ipynb"))
    assert code == 2 and err.startswith("batch error: notebook not found: ")
    code, err = run_cli(capsys, "batch", str(NOTEBOOK), "-p", "staleness_treshold", "0.5", "--run-dir", str(tmp_path))
    assert code == 2
    assert err.startswith("batch error: unknown parameter 'staleness_treshold' for 01_four_modes.ipynb; "
                          "did you mean 'staleness_threshold'? (declared: modes, total_training_steps, "), err
    assert not list(tmp_path.iterdir())  # refused before the run dir was made or a kernel started


# ------------------------------------------------------------------------- batch parameters (6, 9)
def test_declared_parameters_read_the_parameters_cell():
    assert declared_parameters(NOTEBOOK) == ["modes", "total_training_steps", "repeats", "staleness_threshold",
                                             "trigger_parameter_sync_step", "seed", "ray_address", "snapshot_dir"]
    # a comment with quotes that papermill's own line parser gives up on
    assert "task_names" in declared_parameters(REPO / "notebooks" / "04_sandboxed_agents.ipynb")


def test_values_keep_their_types_for_papermill():
    assert parse_value("(-1, 1)") == (-1, 1) and parse_value("abcd") == "abcd" and parse_value("null") is None
    assert to_papermill(parse_value("(-1, 1)")) == [-1, 1]
    assert to_papermill(parse_value("{'a': (1, 2), 'b': {3, 1}}")) == {"a": [1, 2], "b": [1, 3]}
    with pytest.raises(BatchParameterError, match="'blob': a value of type bytes"):
        to_papermill(parse_value("b'x'"), "blob")
    with pytest.raises(BatchParameterError, match=r"'modes': a value of type complex"):
        check_parameters(NOTEBOOK, {"modes": parse_value("1j")})


def test_tuple_reaches_the_notebook_as_a_list_not_a_string(tmp_path):
    """Papermill's own injection: ``pair = [-1, 1]`` (it used to write ``pair = "(-1, 1)"``)."""
    import nbformat
    from papermill.parameterize import parameterize_notebook

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("pair = (0, 0)\nnested = {}")
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell]
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    path = tmp_path / "p.ipynb"
    nbformat.write(nb, path)
    params = check_parameters(path, {"pair": parse_value("(-1, 1)"), "nested": parse_value("{'a': (1, 2)}")})
    loaded = nbformat.read(path, as_version=4)
    loaded.metadata["papermill"] = {}
    injected = parameterize_notebook(loaded, params).cells[1].source
    scope: dict = {}
    exec(injected, scope)
    assert scope["pair"] == [-1, 1] and scope["nested"] == {"a": [1, 2]}
    with pytest.raises(BatchParameterError, match="unknown parameter 'pairs'.*did you mean 'pair'"):
        check_parameters(path, {"pairs": 1})
    bare = nbformat.v4.new_notebook()
    nbformat.write(bare, tmp_path / "bare.ipynb")
    with pytest.raises(BatchParameterError, match="has no cell tagged 'parameters'"):
        check_parameters(tmp_path / "bare.ipynb", {"x": 1})
    assert check_parameters(tmp_path / "bare.ipynb", {"snapshot_dir": "s"}) == {"snapshot_dir": "s"}


def test_a_kernel_that_is_not_installed_is_refused_before_the_run_directory(capsys, tmp_path):
    """The README's ``-k asyncrl`` on a machine that never registered it: papermill's ``NoSuchKernel`` came as two
    tracebacks after the run directory was made (session 30). Now a ``batch error`` names the installed kernels and
    the command that registers one, for ``-k`` and for a notebook whose own kernelspec is missing."""
    import nbformat

    from asyncrl.batch_params import check_kernel

    run_dir = tmp_path / "run"
    code, err = run_cli(capsys, "batch", str(NOTEBOOK), "-k", "no-such-kernel", "--run-dir", str(run_dir))
    assert code == 2 and err.startswith("batch error: no Jupyter kernel named 'no-such-kernel'; installed: "), err
    assert "python3" in err and "python -m ipykernel install --user --name no-such-kernel" in err, err
    assert "Traceback" not in err and not run_dir.exists()
    with pytest.raises(BatchParameterError, match=r"named 'python'; installed: .*did you mean 'python3'\?"):
        check_kernel(NOTEBOOK, "python")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "asyncrl-missing", "language": "python", "display_name": "x"}
    nbformat.write(nb, tmp_path / "k.ipynb")
    with pytest.raises(BatchParameterError, match=r"named 'asyncrl-missing' \(the notebook's kernelspec\)"):
        check_kernel(tmp_path / "k.ipynb", None)
    assert check_kernel(NOTEBOOK, None) == "python3" == check_kernel(tmp_path / "k.ipynb", "python3")


def test_train_dry_run_checks_and_prints_the_config_and_starts_nothing(capsys, tmp_path, monkeypatch):
    """``asyncrl train`` had no way to check a config without starting a run: ``--dry-run`` (Hydra: ``--cfg job``)
    makes the pre-start checks, prints the resolved config as YAML (which ``asyncrl train`` takes back) and exits 0."""
    import ray

    from asyncrl.config import load_config
    from asyncrl.experiment import Experiment
    from asyncrl.recipes import arith_grpo_cpu

    def never(self, *a, **k):
        raise AssertionError("--dry-run started the run")

    monkeypatch.setattr(Experiment, "start", never)
    monkeypatch.setattr(Experiment, "run", never)
    ray_before = ray.is_initialized()
    assert main(["train", "--dry-run", "trainer.total_training_steps=3"]) == 0
    out, err = capsys.readouterr()
    saved = tmp_path / "resolved.yaml"
    saved.write_text(out)
    expected = load_config(None, ["trainer.total_training_steps=3"], base=arith_grpo_cpu())
    expected.trainer.default_local_dir = str(Path(expected.trainer.default_local_dir).absolute())  # as a run's config.yaml
    assert load_config(saved) == expected
    assert "config ok" in err and "nothing started" in err
    assert main(["train", str(saved), "--cfg", "job"]) == 0
    capsys.readouterr()
    long = tmp_path / "long.jsonl"  # the data check of a real start: no prompt fits data.max_prompt_length
    long.write_text("".join(json.dumps({"data_source": "arith", "prompt": "what is " + " + ".join(["1"] * 60) + "?",
                                        "reward_model": {"ground_truth": "60"}}) + "\n" for _ in range(64)))
    code, err = run_cli(capsys, "train", "--dry-run", f"data.train_files={long}")
    assert code == 2 and err.startswith("config error: ") and "data.max_prompt_length" in err, err
    # and the model check of a real start (Experiment.preflight): 64 + 512 tokens past the longtail model's 512 positions
    code, err = run_cli(capsys, "train", "--dry-run", "task=longtail", "actor_rollout_ref.rollout.response_length=512")
    assert code == 2 and "max_position_embeddings=512" in err and "576" in err, err
    assert ray.is_initialized() == ray_before


def test_what_a_run_reads_from_this_machine_is_checked_before_anything_starts(capsys, tmp_path, monkeypatch):
    """Session 30's fresh user: a missing model / tokenizer / critic directory, CPU cores this machine lacks and a
    wandb logger without a key passed ``--dry-run`` ("config ok") and failed ~45 s later, after Ray and vLLM had
    started, as tracebacks. Now ``Experiment.preflight`` (which ``--dry-run`` runs) refuses each in one line."""
    from asyncrl.config import ConfigError, load_config
    from asyncrl.config_ranges import check_local_resources

    (tmp_path / "empty").mkdir()
    for argv, says in (
            (["actor_rollout_ref.model.path=/nonexistent"], "config error: actor_rollout_ref.model.path='/nonexistent': "
                                                            "no such directory"),
            ([f"actor_rollout_ref.model.path={tmp_path / 'empty'}"], "holds no config.json: not a Hugging Face model"),
            (["actor_rollout_ref.model.tokenizer_path=/nonexistent"], "actor_rollout_ref.model.tokenizer_path="),
            (["algorithm.adv_estimator=gae", "critic.model.path=/nonexistent"], "critic.model.path='/nonexistent'"),
            (["actor_rollout_ref.rollout.cpu_affinity=99"], "actor_rollout_ref.rollout.cpu_affinity='99': CPU core(s) "
                                                            "[99] do not exist on this machine"),
    ):
        code, err = run_cli(capsys, "train", "--dry-run", *argv)
        assert code == 2 and says in err and "Traceback" not in err, (argv, err)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no `wandb login`
    online = load_config(overrides=["trainer.logger=[console,wandb]"])
    with pytest.raises(ConfigError, match="no W&B API key .* set trainer.wandb_mode=offline"):
        check_local_resources(online)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    check_local_resources(online)
    check_local_resources(load_config(overrides=["trainer.logger=[wandb]", "trainer.wandb_mode=offline"]))
    cluster = load_config(overrides=["trainer.cpu_affinity=99", "ray.address=auto"])  # a cluster's cores are its nodes'
    check_local_resources(cluster)


def test_load_config_names_an_argument_of_the_wrong_kind():
    """``overrides="k=v"`` was walked character by character ("override 't' is not of the form key=value"),
    ``overrides=[5]`` raised TypeError, a dict for the path "cannot read config file \"{...}\"" (session 30)."""
    from asyncrl.config import ConfigError, load_config

    for kw, says in (({"overrides": "trainer.total_training_steps=3"}, "expected a list of 'key=value' strings, got "
                                                                        "'trainer.total_training_steps=3'"),
                     ({"overrides": [5]}, "expected a list of 'key=value' strings, got [5]"),
                     ({"yaml_path": {"trainer": {}}}, "expected a YAML file's path, got a dict (a mapping of keys")):
        with pytest.raises(ConfigError, match=re.escape(says)):
            load_config(**kw)
    assert load_config(overrides=("trainer.total_training_steps=3",)).trainer.total_training_steps == 3


def test_a_file_that_is_no_notebook_or_no_gguf_is_a_user_error(capsys, tmp_path):
    """``asyncrl batch README.md`` raised nbformat's NotJSONError and ``asyncrl models fetch some.jsonl`` the gguf
    reader's ValueError, as tracebacks (session 30)."""
    code, err = run_cli(capsys, "batch", str(REPO / "README.md"), "--run-dir", str(tmp_path / "run"))
    assert code == 2 and err.startswith(f"batch error: {REPO / 'README.md'} is not a Jupyter notebook (NotJSONError"), err
    assert not (tmp_path / "run").exists()
    fake = tmp_path / "model.gguf"
    fake.write_text('{"not": "a model"}\n')
    code, err = run_cli(capsys, "models", "fetch", str(fake), "--cache-dir", str(tmp_path / "cache"))
    assert code == 2 and err.startswith(f"models fetch error: {fake} is not a GGUF file (it does not start with the "
                                        "GGUF magic bytes)"), err


def test_a_ray_address_nothing_answers_at_is_refused_in_seconds(capsys):
    """``ray.address=bogus:1`` passed ``--dry-run`` and then hung: Ray retried its GCS for minutes (7 in a notebook's
    ``start_ray``), and a SIGTERM came back as ``SystemExit: 15`` (session 30). Now a TCP check names it first."""
    import time

    from asyncrl.config import ConfigError
    from asyncrl.ray_start import check_reachable

    t0 = time.monotonic()  # a process of its own: in this one another test's Ray may be up (start() then uses it)
    proc = subprocess.run([sys.executable, "-m", "asyncrl.cli", "train", "ray.address=127.0.0.1:1", "steps=1"],
                          capture_output=True, text=True, timeout=280, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(
        "config error: ray.address='127.0.0.1:1': nothing answers at 127.0.0.1:1 (ConnectionRefusedError"), proc.stderr
    assert time.monotonic() - t0 < 120
    with pytest.raises(ConfigError, match=r"ray.address='ray://127.0.0.1:1': nothing answers at 127.0.0.1:1"):
        check_reachable("ray://127.0.0.1:1")
    for fine in (None, "auto", "local"):
        check_reachable(fine)


def test_dry_run_names_the_rows_a_run_would_skip_as_too_long(capsys, tmp_path):
    """A run counts a prompt longer than ``data.max_prompt_length`` as ``prompt_too_long`` each time it is drawn,
    naming no row; ``--dry-run`` said "config ok (40 training prompts)" (session 30). It now names them."""
    rows = [{"data_source": "arith", "prompt": [{"role": "user", "content": "1+" * 200 + "1" if i in (7, 30) else f"{i}+1"}],
             "reward_model": {"ground_truth": str(i + 1)}} for i in range(40)]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, err = run_cli(capsys, "train", "--dry-run", f"data.train_files={path}")
    assert code == 0 and ("note: 2 of 40 training prompts are longer than data.max_prompt_length=64 tokens (rows 7, "
                          "30 of data.train_files, in file order)") in err, err
    code, err = run_cli(capsys, "train", "--dry-run", f"data.train_files={path}", "data.max_prompt_length=480")
    assert code == 0 and "note:" not in err, err


def test_a_recipe_flag_that_is_not_a_bool_is_refused():
    """``longtail_grpo_cpu("yes")`` (and "no") read as colocated (session 30)."""
    from asyncrl.recipes import longtail_grpo_cpu

    for bad in ("yes", "no", 1):
        with pytest.raises(TypeError, match=r"longtail_grpo_cpu\(colocated=...\): True or False, got"):
            longtail_grpo_cpu(bad)
    assert longtail_grpo_cpu(True).actor_rollout_ref.hybrid_engine and not longtail_grpo_cpu().actor_rollout_ref.hybrid_engine


def test_short_aliases_work_after_hydras_plus_and_tilde():
    """A fresh user's pass (session 33): ``+seed=5`` and ``~seed`` said 'unknown config key seed' where ``seed=5``
    works: the alias is resolved after Hydra's ``+`` / ``++`` / ``~`` too; other overrides pass as typed."""
    from asyncrl.cli import _expand

    assert _expand(["+seed=5", "++steps=3", "~seed", " task=arith", "x.seed=2", "~trainer.seed"]) == [
        "+trainer.seed=5", "++trainer.total_training_steps=3", "~trainer.seed", "data.task=arith", "x.seed=2",
        "~trainer.seed"]


def test_a_file_name_that_is_not_utf8_is_a_config_error_naming_its_bytes_and_a_link_to_make(tmp_path):
    """``data.train_files=/data/x<0xff>.jsonl`` (a name's bytes, which Python hands over as surrogates) crashed
    ``--dry-run`` with UnicodeEncodeError (the config listing; a run's config.yaml likewise), and a quoted one the
    override parser. Refused before anything starts with the byte shown and a UTF-8 link to make, which then works."""
    import os

    bad = os.fsdecode(os.fsencode(str(tmp_path)) + b"/d\xff.jsonl")
    Path(bad).write_text("".join(json.dumps({"data_source": "arith", "prompt": f"what is {i} + 1?",
                                             "reward_model": {"ground_truth": str(i + 1)}}) + "\n" for i in range(64)))
    proc = subprocess.run([sys.executable, "-m", "asyncrl.cli", "train", "--dry-run",
                           os.fsencode(f"data.train_files={bad}")], capture_output=True, timeout=300, cwd=REPO)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "Traceback" not in err, err
    shown, link = f"{tmp_path}/d\\xff.jsonl", f"{tmp_path}/d_.jsonl"
    assert err.strip() == (
        f"config error: data.train_files={shown} in an override is not UTF-8 text (the byte \\xff, passed on as typed "
        "or as a file name holds it): a run writes its config as UTF-8 text (config.yaml in the run directory, "
        f"--dry-run's listing), which cannot hold it; rename the file to a UTF-8 name, or link one to it "
        f"(ln -s $'{shown}' '{link}') and give that")
    os.symlink(bad, link)
    proc = subprocess.run([sys.executable, "-m", "asyncrl.cli", "train", "--dry-run", f"data.train_files={link}"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0 and "config ok (64 training prompts)" in proc.stderr, proc.stderr
