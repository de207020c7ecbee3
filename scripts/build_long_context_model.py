#!/usr/bin/env python
"""Build the long-context variant of the embedded tiny model (8,192 positions) offline.

    python scripts/build_long_context_model.py --out asyncrl/models/tiny_qwen2_long

Why: Harbor's Terminus-2 sends a ~3,000-character system prompt plus the task and the terminal
screen; with the embedded byte-level tokenizer that is 3,500+ tokens, past the embedded model's 512
positions. Qwen2 uses rotary position embeddings, so positions are not parameters: the variant is the
embedded checkpoint (same weights, tokenizer and chat template) with ``max_position_embeddings`` raised,
which lets vLLM serve ``max_model_len`` up to that. The model was trained on short arithmetic prompts,
so its answers to Terminus-2 are poor; it exists so the agent path (Harbor -> sandbox -> trajectory
proxy -> vLLM) runs for real end to end. Runs in about a second; no training.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from asyncrl.models import EMBEDDED_MODEL_DIR  # noqa: E402

FILES = ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
         "generation_config.json")


def build(out: Path, source: Path = EMBEDDED_MODEL_DIR, positions: int = 8192) -> dict:
    """Write the variant to ``out`` and return its card.

    Args:
        out: output model directory (created; files overwritten).
        source: the embedded model directory the weights come from.
        positions: ``max_position_embeddings`` of the variant (>= 4096 for Terminus-2).
    """
    out.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        if (source / name).exists():
            shutil.copyfile(source / name, out / name)
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    tok_cfg["model_max_length"] = positions
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    config = json.loads((source / "config.json").read_text())
    config["max_position_embeddings"] = positions
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    sha = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    card = {"name": out.name, "positions": positions,
            "how": {"script": "scripts/build_long_context_model.py",
                    "command": f"python scripts/build_long_context_model.py --out {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}"
                               f" --positions {positions}",
                    "source": source.name, "weights_sha256": sha},
            "note": "the embedded model's weights with more rotary positions; trained on short arithmetic "
                    "prompts only, so long-context answers are poor (used to run agent paths for real)"}
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    return card


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "asyncrl/models/tiny_qwen2_long"))
    p.add_argument("--positions", type=int, default=8192)
    ns = p.parse_args()
    print(json.dumps(build(Path(ns.out).resolve(), positions=ns.positions), indent=2))


if __name__ == "__main__":
    main()
