"""asyncrl: fully asynchronous RL for LLMs, driven from notebooks, papermill and a CLI."""

from asyncrl.config import ExperimentConfig, load_config

__all__ = ["ExperimentConfig", "load_config"]
__version__ = "0.1.0"
