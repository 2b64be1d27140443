"""The figures of experiments/robustness.py across its models, from a finished sweep's runs.

  python experiments/robustness_figures.py --workdir=/tmp/robustness --out=docs/figures

Reads each run's summary.json under WORKDIR and writes two figures, one line per model:
``robustness_attacks.png`` (accuracy under FGSM and PGD against epsilon, the capsule models'
vote attacks dashed) and ``robustness_rotations.png`` (accuracy against the rotation angle of
the test digits, the training range shaded). Chance is the dotted line. Each run's own figures
(per attack, per transform) are in its workdir.
"""

import glob
import json
import os

from absl import app, flags

from capsjax.common import figures

_WORKDIR = flags.DEFINE_string("workdir", None, "The sweep's --workdir.", required=True)
_OUT = flags.DEFINE_string("out", ".", "Folder for the two figures.")

EPSILONS = (0.0, 0.05, 0.1, 0.2, 0.3)
ANGLES = (-90, -75, -60, -45, -30, -15, 0, 15, 30, 45, 60, 75, 90)


def runs(workdir: str) -> dict[str, dict]:
  """``{model: evaluations}`` of every finished run (``...model=NAME,seed=S``)."""
  found = {}
  for path in sorted(glob.glob(os.path.join(workdir, "*", "summary.json"))):
    name = os.path.basename(os.path.dirname(path)).split("model=")[-1].split(",")[0]
    with open(path) as f:
      found[name] = json.load(f)["evaluations"]
  return found


def attack_figure(models: dict[str, dict], path: str) -> None:
  fig, axes = figures.pyplot().subplots(1, 2, figsize=(10, 3.8), sharey=True)
  for ax, attack in zip(axes, ("fgsm", "pgd")):
    for k, (name, ev) in enumerate(models.items()):
      color = f"C{k}"
      ax.plot(EPSILONS, [ev["adversarial"][f"{attack}_eps{e:g}_accuracy"] for e in EPSILONS],
              marker="o", color=color, label=name)
      vote = ev.get("vote_attack", {})
      if f"vote_{attack}_eps0.1_accuracy" in vote:
        ax.plot(EPSILONS, [vote[f"vote_{attack}_eps{e:g}_accuracy"] for e in EPSILONS],
                linestyle="--", color=color, label=f"{name} (votes)")
    ax.axhline(0.1, color="gray", linestyle=":", label="chance")
    ax.set_title(f"{attack.upper()}, 500 test digits")
    ax.set_xlabel("epsilon (L-infinity)")
  axes[0].set_ylabel("accuracy under attack")
  axes[0].set_ylim(0, 1)
  axes[1].legend(fontsize=7)
  figures.save(fig, path)


def rotation_figure(models: dict[str, dict], path: str) -> None:
  fig, ax = figures.pyplot().subplots(figsize=(6, 3.8))
  ax.axvspan(-30, 30, color="0.9", label="training rotations")
  for name, ev in models.items():
    ax.plot(ANGLES, [ev["transforms"][f"rotation_{a}_accuracy"] for a in ANGLES], marker="o",
            label=name)
  ax.axhline(0.1, color="gray", linestyle=":", label="chance")
  ax.set_xlabel("rotation of the test digits (degrees)")
  ax.set_ylabel("accuracy")
  ax.set_ylim(0, 1)
  ax.set_title("Rotations, 500 test digits (trained within 30 degrees)")
  ax.legend(fontsize=7)
  figures.save(fig, path)


def main(argv):
  del argv
  models = runs(_WORKDIR.value)
  if not models:
    raise SystemExit(f"No finished run (summary.json) under {_WORKDIR.value}.")
  os.makedirs(_OUT.value, exist_ok=True)
  attack_figure(models, os.path.join(_OUT.value, "robustness_attacks.png"))
  rotation_figure(models, os.path.join(_OUT.value, "robustness_rotations.png"))
  print(f"Wrote robustness_attacks.png and robustness_rotations.png in {_OUT.value} "
        f"({', '.join(models)}).")


if __name__ == "__main__":
  app.run(main)
