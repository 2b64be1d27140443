"""Matrix capsules with EM routing on smallNORB (Hinton, Sabour & Frosst 2018, Sec. 5), as the
authors' code trains it (google-research ``capsule_em``: ``experiment.py`` flags,
``norb/norb_record.py``); the network is capsjax/models/em_capsnet.py.

Usage:
  python -m capsjax.main --config=configs/smallnorb_em.py --workdir=/tmp/norb_em
  python -m capsjax.main --config=configs/smallnorb_em.py:small --workdir=/tmp/norb_em_small
Offline: --config.data.dir=DIR with tfds's smallnorb files (configs/smallnorb.py says which).

Data as configs/smallnorb.py: both stereo images as two channels, 96 -> 48, random brightness
(max delta 63) and contrast (0.2-1.8), random 32x32 crops and per-image standardisation in
training, the centre crop at evaluation. A=B=C=D=32 (316,650 parameters; the paper's
"310K"), 3 EM iterations, spread loss on the code's margin schedule, weight decay 2e-7; Adam at
the code's rate 0.01 decayed 0.96 every 20,000 steps (not staircase), batch 64 over all
devices.

Variants (keywords after ':'):
  small   A=64, B=8, C=D=16 (68,618 parameters; the paper's "68K")
  smoke   tiny types, a few steps (tests, on tfds.testing.mock_data)

Evaluations: ``test`` (the centre crop) and ``patching`` (capsjax/evaluators/crops.py: class
scores averaged over the centre crop and its diagonal shifts by 1, 2 and 3 px, 13 crops, as the
code's ``--patching``). Paper: 1.8% test error (1.4% averaged over crops); the authors' code:
1.8% on the centre crop and 1.3% with patching. smallNORB cannot be downloaded on our machines:
no smallNORB result of this config has been measured.
"""

import pathlib

import ml_collections

from capsjax.common import config_args
from capsjax.config.runconfig import import_config_file

_here = pathlib.Path(__file__)
smallnorb = import_config_file(_here.with_name("smallnorb.py"))
em_mnist = import_config_file(_here.with_name("em_mnist.py"))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = config_args.parse_arg(arg, "configs/smallnorb_em.py", small=False, smoke=False)
  c = smallnorb.get_config("smoke" if args.smoke else None)
  em_mnist.code_training(c, small=args.small, smoke=args.smoke)
  # The code's --patching: scores averaged over the centre crop and 12 diagonal shifts.
  c.evals.patching = dict(type="crop_average")
  return c
