"""A deliberately small reading of a task's ``environment/Dockerfile`` for the local sandbox.

Without a container engine there is no image to build. The local sandbox uses the host's
read-only ``/usr`` as the "base image" (``FROM`` is recorded, not pulled) and applies the
instructions that shape the task's files:

- ``WORKDIR`` sets the working directory (``/app`` in most Harbor tasks);
- ``COPY`` / ``ADD`` of build-context files (``--chown``/``--chmod`` flags are ignored);
- ``ENV`` adds environment variables to every sandboxed command;
- ``RUN`` runs inside the sandbox at setup time (no network unless the task allows it).

Everything else (``CMD``, ``EXPOSE``, ``USER``, ``LABEL``, ...) is ignored with a debug log.
Deliberate simplification: ``ARG`` substitution, multi-stage builds and remote ``ADD`` URLs are
not supported; a task that needs them needs a real container engine.
"""

from __future__ import annotations

import json
import logging
import posixpath
import shlex
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)


class DockerfileError(ValueError):
    """An instruction the local sandbox cannot honour (the message names the line)."""


@dataclass
class Instruction:
    """One Dockerfile instruction: ``op`` upper-cased, ``args`` the raw rest of the line."""

    op: str
    args: str
    lineno: int


@dataclass
class BuildPlan:
    """What the local sandbox does with a Dockerfile.

    Attributes:
        base_image: the ``FROM`` image (informational).
        workdir: final ``WORKDIR`` (absolute), default ``/app``.
        steps: ``("copy", src, dst)``, ``("run", command, workdir)`` in file order.
        env: accumulated ``ENV`` variables.
    """

    base_image: str = ""
    workdir: str = "/app"
    steps: list[tuple[str, str, str]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


def parse_instructions(text: str) -> list[Instruction]:
    """Split a Dockerfile into instructions (comments dropped, ``\\`` continuations joined)."""
    out, buf, start = [], "", 0
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue
        if not buf:
            start = lineno
        if stripped.endswith("\\"):
            buf += stripped[:-1].rstrip() + " "
            continue
        buf += stripped
        op, _, args = buf.partition(" ")
        out.append(Instruction(op.upper(), args.strip(), start))
        buf = ""
    if buf:
        op, _, args = buf.partition(" ")
        out.append(Instruction(op.upper(), args.strip(), start))
    return out


def _split_args(args: str) -> list[str]:
    if args.startswith("["):
        return [str(a) for a in json.loads(args)]
    return shlex.split(args)


def _parse_env(args: str) -> dict[str, str]:
    parts = shlex.split(args)
    if parts and "=" not in parts[0]:  # legacy form: ENV KEY value with spaces
        return {parts[0]: args.split(None, 1)[1] if len(parts) > 1 else ""}
    return dict(p.split("=", 1) for p in parts)


def plan_build(text: str) -> BuildPlan:
    """Turn a Dockerfile into a :class:`BuildPlan`.

    Raises:
        DockerfileError: a ``COPY --from`` (multi-stage), an ``ADD`` of a URL, or a relative
            ``WORKDIR`` before any absolute one.
    """
    plan = BuildPlan()
    for ins in parse_instructions(text):
        where = f"Dockerfile line {ins.lineno}"
        if ins.op == "FROM":
            plan.base_image = ins.args.split()[0] if ins.args else ""
        elif ins.op == "WORKDIR":
            wd = ins.args.strip().strip('"')
            if not wd.startswith("/"):
                wd = plan.workdir.rstrip("/") + "/" + wd
            plan.workdir = wd
        elif ins.op in ("COPY", "ADD"):
            parts = [p for p in _split_args(ins.args) if not p.startswith("--")]
            if any(p.startswith("--from") for p in _split_args(ins.args)):
                raise DockerfileError(f"{where}: multi-stage COPY --from is not supported without Docker")
            if len(parts) < 2:
                raise DockerfileError(f"{where}: {ins.op} needs a source and a destination")
            *srcs, dst = parts
            if not dst.startswith("/"):
                dst = plan.workdir.rstrip("/") + "/" + dst
            dst = posixpath.normpath(dst) + ("/" if dst.endswith("/") else "")
            for src in srcs:
                if "://" in src:
                    raise DockerfileError(f"{where}: ADD of a URL is not supported (no network at build)")
                plan.steps.append(("copy", src, dst + ("/" if len(srcs) > 1 and not dst.endswith("/") else "")))
        elif ins.op == "RUN":
            cmd = ins.args
            if cmd.startswith("["):
                cmd = shlex.join(_split_args(cmd))
            plan.steps.append(("run", cmd, plan.workdir))
        elif ins.op == "ENV":
            plan.env.update(_parse_env(ins.args))
        else:
            logger.debug("%s: %s ignored by the local sandbox", where, ins.op)
    return plan
