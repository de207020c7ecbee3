"""Merge the parts' results of ``run_all.sh`` into ``OUTDIR/summary.json`` and print one table.

    python scripts/gpu/summarize.py OUTDIR

Reads ``<part>.json`` (written by the scripts) and ``<part>.rc`` (exit codes), writes ``summary.json``
and removes the merged files, so OUTDIR holds the logs and one summary (the device tool returns at
most 8 files).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

KEYS = {
    "arith": ["accuracy_before", "accuracy_after", "gain_points", "steps", "syncs", "sync_total_s_median",
              "sync_transfer_s_median", "trainer_idle_ratio", "rollouter_idle_ratio"],
    "perf": ["measured_steps", "trainer_tokens_per_s_updating", "mfu_updating", "mfu_wall", "sync_stall_ms_median",
             "sync_engine_transfer_ms_median", "trainer_idle_ratio", "rollouter_idle_ratio", "rollout_tokens_per_s"],
    "sync7b": ["bytes", "stall_ms_median", "pause_ms_median", "send_ms_median", "engine_transfer_ms_median",
               "resume_ms_median", "tensors"],
}


def main(out: Path) -> int:
    summary: dict = {}
    for rc_file in sorted(out.glob("*.rc")):
        part = rc_file.stem
        entry: dict = {"exit_code": int(rc_file.read_text().strip() or -1)}
        js = out / f"{part}.json"
        if js.exists():
            entry.update(json.loads(js.read_text()))
            js.unlink()
        summary[part] = entry
        rc_file.unlink()
    old = out / "summary.json"
    if old.exists():  # a second call of run_all.sh adds its parts
        summary = {**json.loads(old.read_text()), **summary}
    old.write_text(json.dumps(summary, indent=1, default=str))
    for part, e in summary.items():
        status = "OK" if e.get("ok") or (part == "tests" and e["exit_code"] == 0) else "FAILED"
        print(f"{part:7s} {status:6s} exit={e['exit_code']} wall={e.get('wall_s', 0):.0f}s "
              f"checks={e.get('checks', {})} {('error=' + e['error']) if e.get('error') else ''}")
        for k in KEYS.get(part, []):
            v = e.get(k)
            print(f"          {k:34s} {v:.4g}" if isinstance(v, float) else f"          {k:34s} {v}")
    print(f"summary: {old}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1])))
