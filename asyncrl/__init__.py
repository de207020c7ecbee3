"""asyncrl: fully asynchronous RL for LLMs, driven from notebooks, papermill and a CLI."""

from typing import Any

__all__ = ["ExperimentConfig", "load_config"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Lazy, so `import asyncrl.rollout.hf_backend` needs neither omegaconf nor Ray (GPU benchmark hosts).
    if name in __all__:
        from asyncrl import config

        return getattr(config, name)
    raise AttributeError(f"module 'asyncrl' has no attribute {name!r}")
