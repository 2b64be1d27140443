"""Are capsule networks more robust than a CNN, and does routing make them so? MNIST, one
budget for every model.

Question: capsule papers argue robustness (white-box attacks: Hinton et al. 2018, Hahn et al.
2019; detection of adversarial images by reconstruction: Frosst et al. 2018, DARCCC; novel
viewpoints: Hinton et al. 2018), and Gu, Wu & Tresp (ICLR 2021) found attacks through the
routing weakened by the routing itself, attacks on the votes stronger. Here five models train
for the same budget (configs/mnist_robustness.py: 300 steps of 64 digits rotated uniformly
within ±30 degrees and shifted up to 2 px) and are evaluated on the same 500 test digits:
the paper CapsNet with dynamic routing (3 iterations), the same with uniform coupling (no
routing) and with self-attention routing, the baseline CNN, and Efficient-CapsNet. Each is
attacked with FGSM and PGD (10 steps, random start) at epsilon 0-0.3, the capsule models also
with the vote attack; the capsule models' reconstructions flag adversarial images (threshold:
95th percentile on 5,000 validation digits); and each is evaluated on rotations (familiar
within ±30 degrees, novel up to 90), scales, shears and shifts.

  python -m capsjax.sweep experiments/robustness.py --workdir=/tmp/robustness \\
      --config.data.source=idx --config.data.dir=/path/to/mnist

results.md holds the clean test error, tables of accuracy under attack, detection and
transforms (TABLES below) and the comparison at matched familiar-rotation error (MATCHED);
each run's figures (accuracy against epsilon, distance histograms, transform curves) are in
its workdir. One seed on a CPU: differences of a point or two are within what another seed
could change.
"""

BASE_CONFIG = "configs/mnist_robustness.py"

MODELS = ("capsnet", "uniform", "self_attention", "baseline", "efficient")


def get_sweep():
  return {"points": [{"config": f"configs/mnist_robustness.py:model={m}"} for m in MODELS],
          "seeds": [0]}


_EPS = ("0", "0.05", "0.1", "0.2", "0.3")

TABLES = {
    "Accuracy under attack (%, 500 test digits, chance 10%); vote attacks for capsule models":
        [f"adversarial/{a}_eps{e}_accuracy" for a in ("fgsm", "pgd") for e in _EPS[1:]]
        + ["adversarial/pgd_unbounded_accuracy"]
        + [f"vote_attack/vote_{a}_eps{e}_accuracy" for a in ("fgsm", "pgd")
           for e in ("0.1", "0.3")],
    "Gradient-masking checks (100 = holds) and inputs with a zero gradient (%)":
        ["adversarial/check_accuracy_falls", "adversarial/check_pgd_at_least_fgsm",
         "adversarial/check_unbounded_at_most_chance", "adversarial/zero_gradient"],
    "Detection by reconstruction (%; a random detector's rate is the false-positive rate)":
        ["detection/validation_false_positive_rate", "detection/false_positive_rate"]
        + [f"detection/{a}_eps{e}_detection_rate" for a in ("fgsm", "pgd")
           for e in ("0.1", "0.3")]
        + [f"detection/{a}_eps0.3_undetected_success_rate" for a in ("fgsm", "pgd")],
    "Transforms (accuracy %; trained on rotations within ±30 degrees)":
        ["transforms/familiar_rotation_accuracy", "transforms/novel_rotation_accuracy",
         "transforms/rotation_90_accuracy", "transforms/scale_0.6_accuracy",
         "transforms/scale_1.4_accuracy", "transforms/shear_0.4_accuracy",
         "transforms/translation_6_accuracy"],
}

# Novel rotations at matched familiar-rotation error (the evaluations run once, at the end:
# "not reached" where the final familiar error is above the target).
MATCHED = {"familiar": "transforms/familiar_rotation_accuracy",
           "novel": "transforms/novel_rotation_accuracy", "target_errors": (0.05, 0.10)}
