"""One table of what a GPU sitting (experiments/gpu_sitting.sh) finished so far.

  python experiments/sitting_summary.py SITTING_DIR > summary.md

SITTING_DIR holds a folder per stage: a sweep stage's ``results.md`` (the campaign's copy) and
``*.log``; a speed stage's ``speed.jsonl`` (one JSON line per benchmark, capsjax's or the
PyTorch peer's). Stages that did not finish say so; nothing is estimated.
"""

from __future__ import annotations

import json
import pathlib
import sys

STAGES = {"a": ":float32, 3 seeds (validation split of the code, 50 epochs on 50,000)",
          "b": ":stream, 3 seeds (the code's order of examples)",
          "c": "profile of the paper CapsNet's train step, batch 128 and 16",
          "d": "capsjax beside torch.compile with CUDA graphs, batch 128 and 16"}


def sweep_lines(stage: pathlib.Path) -> list[str]:
  results = stage / "results.md"
  if not results.exists():
    logs = sorted(p.name for p in stage.glob("*.log"))
    return [f"no results.md (not finished within its time); logs: {', '.join(logs) or 'none'}"]
  return [line for line in results.read_text().splitlines() if line.strip()]


def speed_lines(stage: pathlib.Path) -> list[str]:
  path = stage / "speed.jsonl"
  if not path.exists():
    return ["no speed.jsonl (not run, or nothing finished)"]
  rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  lines = ["| name | framework | device | batch | train images/s | compile mode |",
           "|---|---|---|---|---|---|"]
  rates = {}
  for r in rows:
    rate = r.get("train_images_per_second", r.get("train_images_per_s"))
    rates[r["name"]] = rate
    lines.append(f"| {r['name']} | {r.get('framework', 'capsjax')} | {r.get('device')} | "
                 f"{r.get('batch_size')} | {rate:,.0f} | {r.get('compile_mode') or '-'} |"
                 if isinstance(rate, (int, float)) else f"| {r['name']} | {r} |")
  for name, rate in rates.items():  # capsjax_bN against torch_bN_compile_graphs.
    if name.startswith("capsnet_b") and name.count("_") == 1:
      batch = name.removeprefix("capsnet_b")
      peer = rates.get(f"torch_b{batch}_compile_graphs")
      if isinstance(rate, (int, float)) and isinstance(peer, (int, float)) and peer:
        lines.append(f"\ncapsjax / torch.compile (CUDA graphs) at batch {batch}: "
                     f"{rate / peer:.2f}x")
  for r in rows:
    if r.get("layer_profile"):
      lines += ["", f"{r['name']} ({r.get('device')}, batch {r.get('batch_size')}, "
                f"{1000 * r.get('train_seconds_per_step', float('nan')):.2f} ms per step):", "",
                "| layer | forward ms | backward ms | share of time | share of bytes |",
                "|---|---|---|---|---|"]
      lines += [f"| {row['layer']} | {row['forward_ms']:.3f} | {row['backward_ms']:.3f} | "
                f"{100 * row['share']:.1f}% | {100 * row.get('bytes_share', float('nan')):.1f}% |"
                for row in r["layer_profile"]]
  kept = {r["name"] for r in rows}
  for log in sorted(stage.glob("*.log")):  # A benchmark or peer that printed no result.
    if log.stem not in kept:
      last = (log.read_text(errors="replace").strip().splitlines() or ["(empty)"])[-1]
      lines.append(f"\n{log.stem}: no result; its log ends: {last[:300]}")
  return lines


def summary(root: pathlib.Path) -> str:
  out = [f"# GPU sitting: {root}", ""]
  for stage, title in STAGES.items():
    folder = root / stage
    out += [f"## {stage}. {title}", ""]
    if not folder.exists():
      out += ["not run", ""]
      continue
    out += (sweep_lines(folder) if stage in "ab" else speed_lines(folder)) + [""]
  return "\n".join(out)


if __name__ == "__main__":
  if len(sys.argv) != 2:
    sys.exit("usage: python experiments/sitting_summary.py SITTING_DIR")
  print(summary(pathlib.Path(sys.argv[1])))
