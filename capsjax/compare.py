"""Compares two setups on the same test examples: paired, seed by seed, with two verdicts.

  python -m capsjax.compare /tmp/runA /tmp/runB                  # two runs
  python -m capsjax.compare /tmp/sweep:iterations=1 /tmp/sweep:iterations=3  # sweep points
  python -m capsjax.compare /tmp/capsnet_sweep /tmp/cnn_sweep    # two sweep directories

A side is a run's workdir, a sweep directory whose finished runs share one setting (their seeds),
or ``SWEEP_DIR:SETTING``: the runs of the sweep whose point name holds every ``key=value`` of
SETTING (``iterations=1``, or the point's whole name without its seed). How runs are paired, and
on which examples: :func:`pair_runs`, docs/training.md.

Prints and writes to ``--output`` (default: ``compare_A_vs_B`` beside A) ``comparison.md``,
``comparison.json`` and ``disagreements.png``, as docs/training.md, "Compare two setups", shows
(:mod:`capsjax.stats.sides`, :mod:`capsjax.stats.paired`, :mod:`capsjax.stats.seed_pairs`).
"""

from __future__ import annotations

import dataclasses
import os
import types

import numpy as np
from absl import flags

from capsjax.common import figures, files
from capsjax.common.errors import UsageError
from capsjax.config import runconfig
from capsjax.runs import cli, predictions
from capsjax.stats import paired, sides
from capsjax.training import sweep_results

FLAGS: types.SimpleNamespace | None = None
FIGURE_EXAMPLES = 24  # Per side in disagreements.png.


def define_flags(flag_values: flags.FlagValues = flags.FLAGS, argv=None):
  """The command's flags, in ``flag_values`` (``argv`` unused: no config flags)."""
  del argv
  global FLAGS
  define = dict(flag_values=flag_values)
  FLAGS = types.SimpleNamespace(
      evaluation=flags.DEFINE_string(
          "evaluation", "test", "Which evaluation's predictions to compare (test, "
          "validation).", **define),
      predictions=flags.DEFINE_enum(
          "predictions", "run", ["run", "evaluate"], "run: the predictions each run wrote at "
          "its end (predictions.npz); evaluate: those of capsjax.evaluate "
          "(evaluation_predictions.npz).", **define),
      output=flags.DEFINE_string("output", None, "Where to write comparison.md, "
                                 "comparison.json and disagreements.png.", **define))
  return FLAGS


def runs_of(spec: str) -> list[tuple[int, str]]:
  """``[(seed, workdir)]`` of one side (see the module docstring), by seed."""
  path, _, setting = spec.partition(":")
  if not os.path.isdir(path):
    raise UsageError(f"{path!r} is not a directory: give a run's workdir or a sweep directory.")
  if runconfig.read_raw(path) is not None:  # A run.
    if setting:
      raise UsageError(f"{spec}: {path} is a run, not a sweep directory; drop ':{setting}'.")
    return [(seed_of(path), path)]
  runs = sorted(d for d in os.listdir(path)
                if runconfig.read_raw(os.path.join(path, d)) is not None)
  if not runs:
    raise UsageError(f"{path} holds no run (no config.json in it or its folders).")
  groups: dict[str, list[str]] = {}
  for name in runs:
    groups.setdefault(",".join(p for p in name.split(",") if not p.startswith("seed=")),
                      []).append(name)
  wanted = [part for part in setting.split(",") if part]
  matching = {g: names for g, names in groups.items()
              if all(part in g.split(",") for part in wanted)}
  if len(matching) != 1:
    found = "none does" if not matching else f"{len(matching)} do"
    raise UsageError(f"{spec}: name one setting of the sweep ({found}); its settings are "
                     + "; ".join(f"{path}:{g}" for g in sorted(groups)) + ".")
  names = next(iter(matching.values()))
  pairs = [(seed_of(os.path.join(path, n)), os.path.join(path, n)) for n in names]
  seeds = [seed for seed, _ in pairs]
  if len(set(seeds)) != len(seeds):
    raise UsageError(f"{spec}: several runs have one seed ({sorted(seeds)}).")
  return sorted(pairs)


def seed_of(workdir: str) -> int:
  return int(runconfig.load(workdir).seed)  # Recorded in effect, as every setting.


def load_side(spec: str, evaluation: str, which: str) -> list[tuple[int, str, object]]:
  """``[(seed, workdir, Predictions)]`` of one side's runs, by seed."""
  name = predictions.RUN_FILE if which == "run" else predictions.EVALUATE_FILE
  found = []
  for seed, workdir in runs_of(spec):
    by_evaluation, _ = predictions.read(os.path.join(workdir, name))
    if evaluation not in by_evaluation:
      raise UsageError(f"{os.path.join(workdir, name)} holds the predictions of "
                       f"{sorted(by_evaluation)}, not {evaluation!r} (--evaluation).")
    found.append((seed, workdir, by_evaluation[evaluation]))
  return found


def pair_runs(side_a: list, side_b: list) -> tuple[list, list]:
  """``([(label, A's run, B's run)], unpaired seeds)``: two runs are one pair whatever their
  seeds; otherwise the runs of one seed are paired."""
  if len(side_a) == 1 and len(side_b) == 1:
    return [(paired.pair_label(side_a[0][0], side_b[0][0]), side_a[0], side_b[0])], []
  by_a, by_b = ({run[0]: run for run in side} for side in (side_a, side_b))
  seeds = sorted(set(by_a) & set(by_b))
  if not seeds:
    raise UsageError(f"The sides share no seed: A has {sorted(by_a)}, B {sorted(by_b)}; where "
                     "a side holds several runs they are paired by seed (two runs named "
                     "directly are compared whatever their seeds).")
  return ([(paired.pair_label(s, s), by_a[s], by_b[s]) for s in seeds],
          sorted(set(by_a) ^ set(by_b)))


def compared_settings(runs: list) -> set[str] | None:
  """The settings the point names of the runs compared hold (``iterations`` of
  ``iterations=1,seed=0``), which the sides are meant to differ in; None where no run is a
  sweep's point."""
  names = {part.partition("=")[0] for _, workdir, _ in runs
           for part in os.path.basename(os.path.normpath(workdir)).split(",")
           if "=" in part and not part.startswith("seed=")}
  return names or None


def draw(path: str, a, b, title: str) -> None:
  """disagreements.png: the examples only A gets wrong, then only B (``a``, ``b``: one seed
  pair's Predictions), from the images of misclassified examples each run kept, under
  ``title`` (the pair and which side is A)."""
  rows_a, rows_b = paired.aligned(a, b)
  wrong_a, wrong_b = ~a.correct[rows_a], ~b.correct[rows_b]
  ids = a.id[rows_a]
  panels = []
  for caption, only, source in (("only A wrong", wrong_a & ~wrong_b, a),
                                ("only B wrong", wrong_b & ~wrong_a, b)):
    chosen = np.flatnonzero(only)[np.argsort(ids[only], kind="stable")][:FIGURE_EXAMPLES]
    kept = ({int(i): k for k, i in enumerate(source.wrong_ids)}
            if source.wrong_images.ndim == 4 else {})  # MultiMNIST's pairs keep no images.
    chosen = [k for k in chosen if int(ids[k]) in kept]
    images = np.stack([source.wrong_images[kept[int(ids[k])]] for k in chosen]) if chosen else (
        np.zeros((0, 1, 1, 1), np.uint8))
    if images.dtype == np.uint8:
      images = images.astype(np.float32) / 255.0
    captions = [f"#{int(ids[k])} {label_text(a.label[rows_a[k]])}: "
                f"A {label_text(a.predicted[rows_a[k]])}, B {label_text(b.predicted[rows_b[k]])}"
                for k in chosen]
    panels.append((disagreement_heading(caption, int(only.sum()), len(chosen)), images, captions))
  figures.save_disagreements(path, panels, title=title)


def disagreement_heading(caption: str, count: int, shown: int) -> str:
  """A panel's heading: how many examples, and why fewer are shown where the run did not keep
  their images (it keeps those of its first ``MAX_WRONG_IMAGES`` misclassified examples, by
  id) or the panel's limit cuts them."""
  if not count:
    return f"{caption}: none"
  text = f"{caption} ({count}; id: label: A's and B's predictions)"
  if shown < min(count, FIGURE_EXAMPLES):
    kept = (f"a run keeps the images of its first {predictions.MAX_WRONG_IMAGES} misclassified "
            "examples")
    text += (f": their images were not kept ({kept})" if not shown else
             f"; {shown} shown, the others' images not kept ({kept})")
  elif shown < count:
    text += f"; the first {shown} shown"
  return text


def label_text(value) -> str:
  """``7``, or ``3+5`` for a MultiMNIST pair's two labels."""
  return "+".join(str(int(v)) for v in np.atleast_1d(value))


def compare_sides(spec_a: str, spec_b: str, evaluation: str = "test", which: str = "run",
                  output: str | None = None) -> dict:
  """Compares the two sides, prints the tables and writes them; returns comparison.json's data."""
  side_a, side_b = (load_side(s, evaluation, which) for s in (spec_a, spec_b))
  pairs, unpaired = pair_runs(side_a, side_b)
  result = paired.compare([(label, a[2], b[2]) for label, a, b in pairs])
  runs_a, runs_b = [a for _, a, _ in pairs], [b for _, _, b in pairs]
  described = [sides.Side.read(spec, runs) for spec, runs in ((spec_a, runs_a), (spec_b, runs_b))]
  differing = sweep_results.differing_settings(runs_a[0][1], runs_b[0][1])
  warned = sides.warnings(*described, differing, compared_settings(runs_a + runs_b),
                          result.own, result.examples, result.seeds)
  text = (sides.markdown(*described, differing, result.own, result.examples, warned, evaluation)
          + paired.markdown(result, evaluation))
  if unpaired:
    text += f"Left out (a seed of one side only): {unpaired}.\n"
  output = output or os.path.join(os.path.dirname(os.path.abspath(spec_a.partition(":")[0])),
                                  f"compare_{name_of(spec_a)}_vs_{name_of(spec_b)}")
  os.makedirs(output, exist_ok=True)
  data = {"a": spec_a, "b": spec_b, "evaluation": evaluation, "predictions": which,
          "unpaired_seeds": unpaired, "settings_differing": differing, "warnings": warned,
          "sides": {name: dataclasses.asdict(side) for name, side in zip("ab", described)},
          **paired.as_json(result)}
  with files.atomic_write(os.path.join(output, "comparison.md")) as f:
    f.write(text)
  files.write_json(os.path.join(output, "comparison.json"), data)
  label, a, b = pairs[0]
  draw(os.path.join(output, "disagreements.png"), a[2], b[2],
       f"Seed pair {label}: A = {spec_a} ({run_name(a[1])}), B = {spec_b} ({run_name(b[1])})")
  print(text + f"Written to {output} (comparison.md, comparison.json, disagreements.png).")
  return data


def run_name(workdir: str) -> str:
  return os.path.basename(os.path.normpath(workdir))


def name_of(spec: str) -> str:
  """A side's short name for the default output folder."""
  path, _, setting = spec.partition(":")
  name = os.path.basename(os.path.normpath(path)) + (f"_{setting}" if setting else "")
  return "".join(c if c.isalnum() or c in "._=-," else "_" for c in name)


def main(argv):
  with cli.clear_errors():
    if len(argv) != 3:
      raise UsageError("Give two sides: python -m capsjax.compare A B (each a run's workdir, "
                       "a sweep directory, or SWEEP_DIR:SETTING).")
    compare_sides(argv[1], argv[2], FLAGS.evaluation.value, FLAGS.predictions.value,
                  FLAGS.output.value)


if __name__ == "__main__":
  cli.run(main, "capsjax.compare", define_flags)
