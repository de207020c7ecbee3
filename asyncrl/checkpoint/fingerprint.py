"""What model a run trained, independent of where its folder is: a fingerprint recorded in each checkpoint.

``trainer.resume_mode=auto`` passes over a checkpoint whose run used another model
(:func:`asyncrl.checkpoint.manager.other_run`). It compared ``actor_rollout_ref.model.path`` as written, so a model
folder that was moved or renamed counted as another model and the run silently started from scratch. A checkpoint
now records :func:`model_fingerprint` of the model folder in its ``meta.json`` (``model_fingerprint``), and ``auto``
compares fingerprints where both are known; the path only for an older checkpoint or a model that is no local folder
(a hub name).

The fingerprint (``v2``) is a sha256 over ``config.json`` and, for each weight file at the folder's top level (by
name), its name, size and bytes: every byte when the weight files total at most :data:`FULL_HASH_LIMIT` (1 GiB: a
sha256 pass over that takes under a second from the page cache, paid where ``auto`` looks for a checkpoint and at a
checkpoint save, once per process for an unchanged folder, :data:`_CACHE`), else 64 KiB read at 8 evenly spaced
offsets of each file, a few reads whatever the model's size. Two fine-tunes of one architecture (identical
config.json and file sizes) differ, as their tensor bytes do; a deliberate simplification above the limit: a change
that touches none of the sampled bytes (a partial fine-tune of a multi-GB model, a merged LoRA on some projections)
goes unseen.

``v1`` (sampled bytes whatever the size; the checkpoints of session 34's first fingerprints) is still computed to
compare with a checkpoint that recorded one (:func:`fingerprint_like`). Standard library only.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Optional

VERSION = "v2"
"""Written before the digest (``v2:<sha256>``): a fingerprint is compared only with one of its own recipe."""

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
SAMPLES, CHUNK = 8, 64 * 1024
FULL_HASH_LIMIT = 1 << 30
"""Weight files totalling at most this many bytes are hashed whole (``v2``); above it, :data:`SAMPLES` windows of
:data:`CHUNK` bytes per file. Measured on the 2-core CPU box (session 34), files in the page cache: the embedded
model's 2.2 MB hashed whole in 3.3 ms (sampled: 0.6 ms), 1 GiB in 0.66 s (about 1.6 GB/s; sampled: under 1 ms); a
cold disk reads at its own speed."""

_CACHE: dict = {}
"""``(version, whole, folder, (name, size, mtime, ctime, inode) of config.json and each weight file)`` -> fingerprint: a
folder unchanged since it was hashed is not read again (a run fingerprints its model at each checkpoint save); a
write or a copy over a file changes its ctime, which no copy preserves."""


def model_fingerprint(path: str | os.PathLike, version: str = VERSION) -> Optional[str]:
    """``<version>:<sha256>`` of the model folder ``path`` (module docstring), or ``None`` when it is no folder holding
    a ``config.json`` (a hub name, a missing folder), cannot be read, or ``version`` is unknown: then only the path
    can be compared."""
    if version not in ("v1", "v2"):
        return None
    folder = Path(path).expanduser()
    digest = hashlib.sha256()
    try:
        config = folder / "config.json"
        weights = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
        stats = [(p.name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
                 for p, st in ((p, p.stat()) for p in (config, *weights))]
        whole = version == "v2" and sum(stat[1] for stat in stats[1:]) <= FULL_HASH_LIMIT
        key = (version, whole, str(folder.absolute()), tuple(stats))
        if key in _CACHE:
            return _CACHE[key]
        digest.update(config.read_bytes())
        for weight in weights:
            size = weight.stat().st_size
            digest.update(f"\0{weight.name}\0{size}\0".encode("utf-8", "surrogateescape"))
            with weight.open("rb") as f:
                if whole:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        digest.update(block)
                    continue
                for i in range(SAMPLES):
                    f.seek(max(0, size - CHUNK) * i // max(1, SAMPLES - 1))
                    digest.update(f.read(CHUNK))
    except OSError:
        return None
    _CACHE[key] = f"{version}:{digest.hexdigest()}"
    return _CACHE[key]


def fingerprint_like(recorded: str, path: str | os.PathLike, current: Optional[str]) -> Optional[str]:
    """The fingerprint of the model folder ``path`` by the recipe of the ``recorded`` one (its ``v1:`` / ``v2:``), to
    compare the two: ``current`` (``path``'s fingerprint by :data:`VERSION`) when the versions agree, ``None`` when
    ``current`` is (no readable folder) or the recorded version is unknown."""
    version = recorded.partition(":")[0]
    if current is None or current.partition(":")[0] == version:
        return current
    return model_fingerprint(path, version)
