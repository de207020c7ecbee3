#!/usr/bin/env python
"""Rebuild the embedded tiny Qwen2 model offline.

    python scripts/build_tiny_model.py --out asyncrl/models/tiny_qwen2_arith

Defaults reproduce the committed checkpoint (see its card.json). Runs on CPU in well under a minute.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncrl.models.build import BuildArgs, build  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="asyncrl/models/tiny_qwen2_arith")
    for f in dataclasses.fields(BuildArgs):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    ns = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = BuildArgs(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(BuildArgs)})
    card = build(ns.out, args)
    print(json.dumps({k: card[k] for k in ("param_count", "vocab_size")} | card["eval"], indent=2))


if __name__ == "__main__":
    main()
