"""Loading a config from YAML and overrides: every mistake a user can make is a ConfigError naming where it is
(the CLI prints it as ``config error: ...`` and exits 2), never a raw PyYAML or OmegaConf traceback."""

from __future__ import annotations

import pytest

from asyncrl.cli import main
from asyncrl.config import ConfigError, load_config


@pytest.mark.parametrize("override, says", [
    ("actor_rollout_ref.rollout.engine_kwargs={vllm:{max_model_len:64}}",
     r"is not valid YAML: found unexpected ':' at line 1, column 6.*a space after each ':'"),
    ("trainer.logger=[console", r"is not valid YAML: did not find expected ',' or '\]' at line 2, column 1.*"
                                r"flow sequence begun at line 1, column 1"),
], ids=["flow_mapping_without_spaces", "unclosed_list"])
def test_an_override_that_is_not_yaml_is_a_config_error(override, says, capsys):
    """Both raised yaml.scanner.ScannerError / yaml.parser.ParserError through ``asyncrl train``."""
    with pytest.raises(ConfigError, match=says):
        load_config(None, [override])
    assert main(["train", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"config error: the value of override {override!r} is not valid YAML") and "Traceback" not in err


def test_a_yaml_file_with_a_syntax_error_or_a_list_at_top_level_is_a_config_error(tmp_path, capsys):
    """A syntax error raised yaml.parser.ParserError; a list at top level ``TypeError: Cannot merge incompatible
    container types``."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  total_training_steps: [1\n")
    with pytest.raises(ConfigError, match=rf"config file '{bad}' is not valid YAML: .* begun at line 2, column 25"):
        load_config(bad)
    listed = tmp_path / "list.yaml"
    listed.write_text("- trainer.total_training_steps=4\n")
    with pytest.raises(ConfigError, match=rf"config file '{listed}' must be a mapping of keys .*not a list"):
        load_config(listed)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")
    for path in (bad, listed):
        assert main(["train", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"config error: config file '{path}'") and "Traceback" not in err, err
