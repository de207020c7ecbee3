"""YAML config files read as Hydra reads them (OmegaConf's loader: YAML 1.1 plus its float fix), with YAML 1.1's
silent changes of meaning refused (:mod:`asyncrl.config_yaml`)."""

from __future__ import annotations

import pytest

from asyncrl.config import ConfigError, load_config, to_yaml


def _file(tmp_path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_exponent_floats_and_yaml_1_1_booleans_of_bool_keys_read_as_hydra_reads_them(tmp_path):
    """``lr: 1e-3`` is a string to PyYAML's YAML 1.1; OmegaConf's loader (Hydra's) reads the float, and so do we."""
    cfg = load_config(_file(tmp_path, "actor_rollout_ref:\n  actor:\n    optim:\n      lr: 1e-3\n"
                                      "async_training:\n  partial_rollout: off\ntrainer:\n  seed: 0x10\n"))
    assert cfg.actor_rollout_ref.actor.optim.lr == 0.001 and isinstance(cfg.actor_rollout_ref.actor.optim.lr, float)
    assert cfg.async_training.partial_rollout is False and cfg.trainer.seed == 16
    reward = tmp_path / "r.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n    return 0\n")
    cfg = load_config(_file(tmp_path, f"custom_reward_function:\n  path: {reward}\n  reward_kwargs: {{a: false, b: 1e-3}}\n"))
    assert cfg.custom_reward_function.reward_kwargs == {"a": False, "b": 0.001}  # both YAML versions read these alike


@pytest.mark.parametrize("text, says", [
    ("trainer:\n  experiment_name: no\n",
     r"line 2: trainer.experiment_name: no is read by YAML 1.1 as False \(bool\), and the key takes str: write 'no' "
     r"\(quoted\) for the text$"),  # was the run named 'False'
    ("trainer:\n  experiment_name: 1e3\n", r"line 2: trainer.experiment_name: 1e3 is read by YAML 1.1 as 1000.0"),
    ("trainer:\n  seed: 0123\n",
     r"line 2: trainer.seed: 0123 is YAML 1.1's octal number 83, not 123: write 123 for the number, or '0123' "
     r"\(quoted\) for the text$"),  # was seed 83
    ("trainer:\n  cpu_affinity: 0123\n", r"line 2: trainer.cpu_affinity: 0123 is YAML 1.1's octal number 83"),  # was '83'
    ("async_training:\n  rollouter_cpu_affinity: 12:30\n",
     r"line 2: async_training.rollouter_cpu_affinity: 12:30 is YAML 1.1's base-60 number 750: write '12:30' \(quoted\)"),
    ("custom_reward_function:\n  reward_kwargs: {version: 0123}\n",
     r"line 2: custom_reward_function.reward_kwargs.version: 0123 is YAML 1.1's octal number 83"),
    ("trainer:\n  seed: no\n", r"line 2: trainer.seed: no is YAML 1.1's boolean false, and the key takes int$"),
    ("trainer:\n  logger: [console, off]\n", r"line 2: trainer.logger: off is read by YAML 1.1 as False \(bool\)"),
])
def test_a_yaml_1_1_reading_that_changes_the_meaning_is_refused_naming_file_line_key_and_text(text, says, tmp_path):
    path = _file(tmp_path, text)
    with pytest.raises(ConfigError, match=rf"^config file '{path}', {says}"):
        load_config(path)


def test_a_value_of_the_wrong_type_in_a_file_names_the_key_and_the_type(tmp_path):
    path = _file(tmp_path, "trainer:\n  seed: abc\n")
    with pytest.raises(ConfigError, match=rf"^invalid value for 'trainer.seed' in config file '{path}', line 2: 'abc' "
                                          r"is not int$"):
        load_config(path)


def test_a_wrong_type_or_unknown_key_in_a_file_names_its_line(tmp_path):
    """A fresh user's pass (session 33): ``cpu_affinity: [0, 1]`` named the key but not the line, unlike the YAML 1.1
    refusals."""
    path = _file(tmp_path, "trainer:\n  seed: 1\n  cpu_affinity: [0, 1]\n")
    with pytest.raises(ConfigError, match=rf"^invalid value for 'trainer.cpu_affinity' in config file '{path}', line 3: "
                                          r"\[0, 1\] is not str; "):
        load_config(path)
    path = _file(tmp_path, "trainer:\n  seed: 1\n  sed: 2\n")
    with pytest.raises(ConfigError, match=rf"^unknown config key 'trainer.sed' in config file '{path}', line 3; "):
        load_config(path)


def test_an_explicit_tag_is_taken_as_tagged(tmp_path):
    """``experiment_name: !!str 0123`` (text tagged as text) was refused as YAML 1.1's octal."""
    cfg = load_config(_file(tmp_path, "trainer:\n  experiment_name: !!str 0123\n  project_name: !!str no\n"))
    assert cfg.trainer.experiment_name == "0123" and cfg.trainer.project_name == "no"


def test_every_yaml_1_1_refusal_of_a_file_comes_in_one_error(tmp_path):
    """Only the first was reported: a user fixed one line per run."""
    path = _file(tmp_path, "trainer:\n  seed: 0123\n  experiment_name: no\n  project_name: 12:30\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    lines = str(info.value).splitlines()
    assert lines[0] == f"config file '{path}' has 3 values YAML 1.1 reads with another meaning:"
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["line 2", "line 3", "line 4"]


def test_an_octal_under_a_str_key_offers_only_the_quoted_text(tmp_path):
    """The hint said 'write 123 for the number' for experiment_name, which takes text."""
    path = _file(tmp_path, "trainer:\n  experiment_name: 0123\n")
    with pytest.raises(ConfigError, match=r"experiment_name: 0123 is YAML 1.1's octal number 83, not 123: write '0123' "
                                          r"\(quoted\) for the text$"):
        load_config(path)


def test_a_plain_equals_sign_is_a_clear_error(tmp_path):
    """``experiment_name: =`` gave PyYAML's 'could not determine a constructor for the tag ...value'."""
    path = _file(tmp_path, "trainer:\n  experiment_name: =\n")
    with pytest.raises(ConfigError, match=rf"^config file '{path}' is not valid YAML: a plain '=' is YAML 1.1's "
                                          r"value-key marker, .* at line 2, column 20 \(quote it: '='\)$"):
        load_config(path)


def test_a_saved_config_yaml_with_look_alike_strings_reads_back_the_same(tmp_path):
    """A run's config.yaml (OmegaConf's dumper quotes a string YAML would read as another type) is not refused."""
    reward = tmp_path / "r.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n    return 0\n")
    cfg = load_config(overrides=[f"custom_reward_function.path={reward}", "trainer.experiment_name=0123",
                                 "custom_reward_function.reward_kwargs={a: no, b: 0123, c: 12:30, d: 1e3, e: off}"])
    saved = _file(tmp_path, to_yaml(cfg))
    again = load_config(saved)
    assert again.trainer.experiment_name == "0123"
    assert again.custom_reward_function.reward_kwargs == {"a": "no", "b": "0123", "c": "12:30", "d": 1000.0, "e": "off"}


def _reward(tmp_path) -> str:
    reward = tmp_path / "r.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n    return 0\n")
    return f"custom_reward_function:\n  path: {reward}\n  reward_kwargs:\n"


@pytest.mark.parametrize("value, says", [
    ("off", r"off is read by YAML 1.1 as False \(bool\) and by YAML 1.2 as 'off', and the key is free-form \(no type "
            r"to choose\): write false for the boolean, or 'off' \(quoted\) for the text$"),  # was False
    ("Yes", r"Yes is read by YAML 1.1 as True \(bool\) and by YAML 1.2 as 'Yes'.*: write true for the boolean, or "
            r"'Yes' \(quoted\) for the text$"),
    ("1_000", r"1_000 is read by YAML 1.1 as 1000 \(int\) and by YAML 1.2 as '1_000'.*: write 1000 for the number, or "
              r"'1_000' \(quoted\) for the text$"),
    ("0b11", r"0b11 is read by YAML 1.1 as 3 \(int\) .*write 3 for the number, or '0b11' \(quoted\)"),
    ("0123", r"0123 is YAML 1.1's octal number 83, not 123: write 123 for the number, or '0123' \(quoted\) for the "
             r"text$"),  # was 83
    ("####", r"#### is a comment, so the value is empty \(null\): write '####' \(quoted\) for the text, or null for no "
             r"value$"),  # was None
    ("#### (\\d+)  # it's", r"#### \(\\d\+\)  # it's is a comment, .*: write '#### \(\\d\+\)  # it''s' \(quoted\)"),
])
def test_a_free_form_value_read_otherwise_by_yaml_1_1_is_refused_with_both_spellings(value, says, tmp_path):
    """A mapping key's values have no type to check: ``mode: off`` became False, ``tag: ####`` None (a comment),
    ``n: 0123`` 83, ``1_000`` 1000, where YAML 1.2 and a reader of the text see text. Refused as the typed keys are,
    with the file and line, and the spellings of both readings."""
    path = _file(tmp_path, _reward(tmp_path) + f"    mode: {value}\n")
    with pytest.raises(ConfigError, match=rf"^config file '{path}', line 4: custom_reward_function.reward_kwargs.mode: "
                                          rf"{says}"):
        load_config(path)


def test_free_form_values_both_yaml_versions_read_alike_are_kept_and_the_spellings_offered_work(tmp_path):
    """What the refusals say to write reads as meant; what YAML 1.1 and 1.2 read alike is kept (``1e-3``, ``0x10``,
    ``null``, an empty value without a comment, a tagged ``!!bool off``), and so are values in engine_kwargs."""
    text = _reward(tmp_path) + ("    a: false\n    b: 'off'\n    c: '####'\n    d: 1000\n    e: '1_000'\n    f: 0x10\n"
                                "    g: .inf\n    h: null\n    i:\n    j: !!bool off\n    k: [true, 'yes']\n"
                                "    l: x  # a comment after a value\n"
                                "actor_rollout_ref:\n  rollout:\n    engine_kwargs:\n      vllm:\n        enforce_eager: true\n")
    cfg = load_config(_file(tmp_path, text))
    assert cfg.custom_reward_function.reward_kwargs == {
        "a": False, "b": "off", "c": "####", "d": 1000, "e": "1_000", "f": 16, "g": float("inf"), "h": None, "i": None,
        "j": False, "k": [True, "yes"], "l": "x"}
    assert cfg.actor_rollout_ref.rollout.engine_kwargs["vllm"] == {"enforce_eager": True}


def test_engine_kwargs_and_list_entries_are_free_form_too(tmp_path):
    """``engine_kwargs.vllm.enforce_eager: yes`` was true without a word; a list entry ``- off`` False."""
    path = _file(tmp_path, _reward(tmp_path) + "    stops:\n      - off\n"
                           "actor_rollout_ref:\n  rollout:\n    engine_kwargs:\n      vllm:\n        enforce_eager: yes\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    lines = [line.strip() for line in str(info.value).splitlines()]
    assert lines[1].startswith("line 5: custom_reward_function.reward_kwargs.stops: off is read by YAML 1.1 as False")
    assert lines[2].startswith("line 10: actor_rollout_ref.rollout.engine_kwargs.vllm.enforce_eager: yes is read by "
                               "YAML 1.1 as True (bool) and by YAML 1.2 as 'yes'")


def test_on_the_command_line_a_free_form_value_follows_hydras_grammar(tmp_path):
    """Hydra's override grammar reads only true / false (any case) as booleans: ``+...reward_kwargs.mode=off`` is the
    text 'off' there and here; ``####`` is text, not a comment; ``0123`` and ``1_000`` are as Hydra reads them."""
    reward = tmp_path / "r.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n    return 0\n")
    kw = "custom_reward_function.reward_kwargs"
    cfg = load_config(overrides=[f"custom_reward_function.path={reward}", f"+{kw}.mode=off", f"+{kw}.tag=####",
                                 f"+{kw}.n=0123", f"+{kw}.u=1_000", f"+{kw}.b=TRUE", f"+{kw}.y=yes"])
    assert cfg.custom_reward_function.reward_kwargs == {"mode": "off", "tag": "####", "n": "0123", "u": 1000, "b": True,
                                                        "y": "yes"}


@pytest.mark.parametrize("raw, line, column, byte, shown", [
    (b"trainer:\n  experiment_name: caf\xe9\n", 2, 23, r"\xe9", r"experiment_name: caf\xe9"),  # Latin-1 'café'
    (b"data:\n  train_files: bad\xff.jsonl\n", 2, 19, r"\xff", r"train_files: bad\xff.jsonl"),
    (b"custom_reward_function:\n  reward_kwargs:\n    m\xff: 1\n", 3, 6, r"\xff", r"m\xff: 1"),  # in a key
])
def test_a_config_file_that_is_not_utf8_is_a_config_error_naming_line_and_byte(raw, line, column, byte, shown,
                                                                                 tmp_path, capsys):
    """A session-34 tester's finding: a YAML file saved as Latin-1 (a Windows editor's ``caf\\xe9``) was a
    UnicodeDecodeError traceback from OmegaConf's loader, exit 1. Now a config error (exit 2) naming the file, line,
    column and byte, and how to re-save it as UTF-8."""
    from asyncrl.cli import main

    path = tmp_path / "c.yaml"
    path.write_bytes(raw)
    says = (f"config file '{path}', line {line}, column {column}: the byte {byte} (in: {shown}) is not UTF-8 text, "
            f"which YAML config files are: the file was saved in another encoding (Latin-1 or Windows-1252, as some "
            f"editors save): re-save it as UTF-8, e.g. iconv -f latin1 -t utf-8 '{path}' > '{path}.utf8' && "
            f"mv '{path}.utf8' '{path}' (a file name it gives that holds the byte: rename that file to a UTF-8 name)")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == says
    assert main(["train", "--dry-run", str(path)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"config error: {says}"
    path.write_bytes(raw.decode("latin-1").encode("utf-8"))  # the fix the error gives (iconv -f latin1 -t utf-8)
    if b"train_files" not in raw and b"reward_kwargs" not in raw:
        assert load_config(path).trainer.experiment_name == "café"
