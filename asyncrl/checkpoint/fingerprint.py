"""What model a run trained, independent of where its folder is: a fingerprint recorded in each checkpoint.

``trainer.resume_mode=auto`` passes over a checkpoint whose run used another model
(:func:`asyncrl.checkpoint.manager.other_run`). It compared ``actor_rollout_ref.model.path`` as written, so a model
folder that was moved or renamed counted as another model and the run silently started from scratch. A checkpoint
now records :func:`model_fingerprint` of the model folder in its ``meta.json`` (``model_fingerprint``), and ``auto``
compares fingerprints where both are known; the path only for an older checkpoint or a model that is no local folder
(a hub name).

The fingerprint is a sha256 over ``config.json`` and, for each weight file at the folder's top level (by name), its
name, size and 64 KiB read at 8 evenly spaced offsets: a few reads whatever the model's size, and two fine-tunes of
one architecture (identical config.json and file sizes) still differ, as their tensor bytes do. A deliberate
simplification: a change that touches none of the sampled bytes goes unseen.

Standard library only.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Optional

VERSION = "v1"
"""Written before the digest (``v1:<sha256>``): a later recipe for the fingerprint is never compared with this one."""

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
SAMPLES, CHUNK = 8, 64 * 1024


def model_fingerprint(path: str | os.PathLike) -> Optional[str]:
    """``v1:<sha256>`` of the model folder ``path`` (module docstring), or ``None`` when it is no folder holding a
    ``config.json`` (a hub name, a missing folder) or cannot be read: then only the path can be compared."""
    folder = Path(path).expanduser()
    digest = hashlib.sha256()
    try:
        digest.update((folder / "config.json").read_bytes())
        weights = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
        for weight in weights:
            size = weight.stat().st_size
            digest.update(f"\0{weight.name}\0{size}\0".encode("utf-8", "surrogateescape"))
            with weight.open("rb") as f:
                for i in range(SAMPLES):
                    f.seek(max(0, size - CHUNK) * i // max(1, SAMPLES - 1))
                    digest.update(f.read(CHUNK))
    except OSError:
        return None
    return f"{VERSION}:{digest.hexdigest()}"
