"""Robustness evaluations for a trained run, without retraining (``python -m capsjax.evaluate
--evals``), or to list in a config's ``evals``.

Usage:
  python -m capsjax.evaluate --workdir=/tmp/run --evals=configs/evals/robustness.py
  python -m capsjax.evaluate --workdir=/tmp/run \\
      --evals=configs/evals/robustness.py:detection,limit=200 --evals.detection.epsilons=0,0.1

Variants (keywords after ':', any together; none given: adversarial):
  adversarial  FGSM and PGD, untargeted, epsilons 0-0.3 (capsjax/evaluators/adversarial.py)
  vote         the vote attack of Gu et al. 2021 with FGSM and PGD (capsule models)
  detection    DARCCC's detection by reconstruction (capsjax/evaluators/detection.py; needs a
               run with a validation split and a decoder)
  limit=N      test examples of each (default 1000)
"""

import ml_collections

from capsjax.common import config_args

EPSILONS = (0.0, 0.05, 0.1, 0.2, 0.3)  # For images in [0, 1] (MNIST-like).


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = config_args.parse_arg(arg, "configs/evals/robustness.py", adversarial=False,
                               vote=False, detection=False, limit=1000)
  c = ml_collections.ConfigDict()
  if args.adversarial or not (args.vote or args.detection):
    c.adversarial = dict(type="adversarial", attacks=("fgsm", "pgd"), epsilons=EPSILONS,
                         steps=10, limit=args.limit)
  if args.vote:
    c.vote_attack = dict(type="adversarial", attacks=("vote_fgsm", "vote_pgd"),
                         epsilons=EPSILONS, steps=10, limit=args.limit)
  if args.detection:
    c.detection = dict(type="reconstruction_detection", attacks=("fgsm", "pgd"),
                       epsilons=EPSILONS, steps=10, limit=args.limit, percentile=95.0)
  return c
