"""Strip outputs, execution counts and run metadata from the notebooks (what git keeps).

    python scripts/strip_notebooks.py            # rewrite notebooks/*.ipynb in place
    python scripts/strip_notebooks.py --check    # exit 1 and list the notebooks that need stripping
    python scripts/strip_notebooks.py --record runs/batch/01_four_modes__<time>/01_four_modes.ipynb
                                                 # copy the checked outputs of a smoke run into notebooks/

Same effect as ``nbstripout`` (also usable: ``nbstripout --install`` registers a git filter), without
needing a git filter in CI, with one exception: cells tagged ``nbval-check-output`` keep their outputs.
Those are the reference outputs nbval compares a reader's "Run All" against (``pytest --nbval-lax``,
``tests/test_nbval.py``): deterministic ones only, such as a budget table or the chapter's list of checked
claims (``nb.claims()``). ``--record`` takes them from an executed notebook (a smoke-size run, ``CI=1``:
``asyncrl batch NOTEBOOK --env CI=1``), matching cells by id, else by source.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

KEEP_NB_METADATA = ("kernelspec", "language_info")
KEEP_CELL_METADATA = ("tags", "jupyter")
CHECKED_TAG = "nbval-check-output"
REFERENCE_COUNT = 1  # the execution count of a checked cell with a reference output


def is_checked(cell: nbformat.NotebookNode) -> bool:
    """The cell's outputs are a reference that nbval compares (tag ``nbval-check-output``)."""
    return CHECKED_TAG in cell.get("metadata", {}).get("tags", [])


def _clean_output(out: nbformat.NotebookNode) -> nbformat.NotebookNode:
    out = nbformat.from_dict(dict(out))
    out.pop("execution_count", None)
    if "metadata" in out:
        out["metadata"] = {}
    if out.get("output_type") == "execute_result":
        out["execution_count"] = None
    return out


def strip(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    nb.metadata = {k: v for k, v in nb.metadata.items() if k in KEEP_NB_METADATA}
    for cell in nb.cells:
        cell.metadata = {k: v for k, v in cell.metadata.items() if k in KEEP_CELL_METADATA}
        if cell.cell_type == "code":
            cell.outputs = [_clean_output(o) for o in cell.outputs] if is_checked(cell) else []
            # nbval treats a cell without a count as unrun and refuses its outputs ("Unrun reference cell
            # has outputs"): a reference keeps a fixed count, so it is checked and its diff stays stable
            cell.execution_count = REFERENCE_COUNT if cell.outputs else None
    return nb


def record(executed: Path, notebooks_dir: Path = Path("notebooks")) -> Path:
    """Copy the outputs of ``nbval-check-output`` cells from ``executed`` into the source notebook of the
    same name. Returns the source notebook's path.

    Raises:
        FileNotFoundError: no source notebook of that name.
        ValueError: a checked cell of the source has no counterpart in ``executed``, or it failed there.
    """
    src_path = notebooks_dir / executed.name
    src = nbformat.read(src_path, as_version=4)
    run = nbformat.read(executed, as_version=4)
    by_id = {c.get("id"): c for c in run.cells}
    by_source = {c.source: c for c in run.cells}
    for cell in src.cells:
        if cell.cell_type != "code" or not is_checked(cell):
            continue
        done = by_id.get(cell.get("id")) or by_source.get(cell.source)
        if done is None or done.source != cell.source:
            raise ValueError(f"{executed}: no executed cell matches the checked cell {cell.source[:60]!r}")
        if any(o.get("output_type") == "error" for o in done.outputs):
            raise ValueError(f"{executed}: the checked cell {cell.source[:60]!r} failed")
        cell.outputs = done.outputs
    src_path.write_text(nbformat.writes(strip(src)) + "\n", encoding="utf-8")
    return src_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", default=sorted(str(p) for p in Path("notebooks").glob("*.ipynb")))
    ap.add_argument("--check", action="store_true", help="only report notebooks that are not stripped")
    ap.add_argument("--record", metavar="EXECUTED", action="append", default=[],
                    help="copy the nbval-check-output cells' outputs of this executed notebook into notebooks/")
    args = ap.parse_args(argv)
    for executed in args.record:
        print("recorded checked outputs into " + str(record(Path(executed))))
    if args.record:
        return 0
    dirty = []
    for path in args.paths:
        text = Path(path).read_text(encoding="utf-8")
        nb = strip(nbformat.reads(text, as_version=4))
        new = nbformat.writes(nb) + "\n"
        if new != text:
            dirty.append(path)
            if not args.check:
                Path(path).write_text(new, encoding="utf-8")
    for path in dirty:
        print(("needs stripping: " if args.check else "stripped: ") + path)
    return 1 if args.check and dirty else 0


if __name__ == "__main__":
    sys.exit(main())
