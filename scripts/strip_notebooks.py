"""Strip outputs, execution counts and run metadata from the notebooks (what git keeps).

    python scripts/strip_notebooks.py            # rewrite notebooks/*.ipynb in place
    python scripts/strip_notebooks.py --check    # exit 1 and list the notebooks that need stripping

Same effect as ``nbstripout`` (also usable: ``nbstripout --install`` registers a git filter), without
needing a git filter in CI.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

KEEP_NB_METADATA = ("kernelspec", "language_info")
KEEP_CELL_METADATA = ("tags", "jupyter")


def strip(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    nb.metadata = {k: v for k, v in nb.metadata.items() if k in KEEP_NB_METADATA}
    for cell in nb.cells:
        cell.metadata = {k: v for k, v in cell.metadata.items() if k in KEEP_CELL_METADATA}
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", default=sorted(str(p) for p in Path("notebooks").glob("*.ipynb")))
    ap.add_argument("--check", action="store_true", help="only report notebooks that are not stripped")
    args = ap.parse_args(argv)
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
