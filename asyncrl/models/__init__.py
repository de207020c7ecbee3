"""The embedded tiny model: a 0.5M-parameter Qwen2 with a character-level tokenizer, built offline.

``EMBEDDED_MODEL_DIR`` is a standard HF model directory (float32 safetensors, tokenizer.json,
tokenizer_config.json with the chat template, generation_config.json) that both transformers and
vLLM load. It is warm-started on the ``arith`` task to a deliberately partial held-out greedy accuracy
(see its ``card.json``); rebuild it with ``python scripts/build_tiny_model.py``.
"""

from __future__ import annotations

from pathlib import Path

EMBEDDED_MODEL_DIR = Path(__file__).resolve().parent / "tiny_qwen2_arith"
"""Directory of the committed embedded checkpoint."""

LONG_CONTEXT_MODEL_DIR = Path(__file__).resolve().parent / "tiny_qwen2_long"
"""The embedded checkpoint with 8,192 rotary positions (for long agent prompts such as Harbor's
Terminus-2); rebuild it with ``python scripts/build_long_context_model.py``."""


def load_tokenizer(path: str | Path = EMBEDDED_MODEL_DIR):
    """Load a tokenizer (the embedded one by default) offline.

    Args:
        path: HF model directory.

    Returns:
        A ``transformers`` fast tokenizer with the chat template attached.

    Raises:
        OSError: ``path`` holds no tokenizer files.
    """
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


__all__ = ["EMBEDDED_MODEL_DIR", "LONG_CONTEXT_MODEL_DIR", "load_tokenizer"]
