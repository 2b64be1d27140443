"""The affNIST robustness experiment (paper Sec. 5.2): train on expanded MNIST, test on
affine-transformed digits.

Usage:
  python -m capsjax.main --config=configs/affnist.py --workdir=/tmp/affnist
  python -m capsjax.main --config=configs/affnist.py:baseline --workdir=/tmp/affnist_cnn
  # with the real affNIST test set (https://www.cs.toronto.edu/~tijmen/affNIST/):
  ... --config.evals.affnist.path=/data/affnist/test.mat

Training data, "expanded MNIST": every MNIST digit centred on a 40x40 black
canvas (data.pad = 6) and moved by up to 6 px in x and y per example inside
the jitted step (data.shift_pixels = 6), i.e. placed at a random position;
the official code builds it with ``--pad=6 --shift=6``. The paper's result:
CapsNet 99.23% on the expanded MNIST test set and 79% on affNIST; a CNN "with
a similar number of parameters" trained "with max pooling and dropout" 99.22%
and 66%. The paper compared the two at matched in-distribution accuracy;
``train.stop_at_accuracy`` makes that comparison runnable
(experiments/affnist.py).

Evaluations:
  test                   the expanded MNIST test set, digits centred;
  test_random_placement  a fixed copy with every digit at a random position (seed 0);
  affine_mnist           the offline stand-in for affNIST: each test digit under a random
                         affine transform made here (capsjax/datasets/affine.py); NOT affNIST;
  affnist                the real affNIST test set, once evals.affnist.path is set.

Models: CapsNet as on MNIST at 40x40 input: 13,475,648 parameters. Variant
``baseline``: the baseline CNN of configs/mnist_baseline.py with 2x2 max pooling
after the first two convolutions, dropout 0.5, and a first hidden layer of 847
so that it has 13,471,833 parameters, like CapsNet (the paper does not give
this network's sizes). Variant ``smoke``: tiny models for a few steps (tests);
keywords combine, ``configs/affnist.py:baseline,smoke`` (``:baseline_smoke``, the older
spelling, still works).
"""

import pathlib

import ml_collections
from ml_collections import config_dict

from capsjax.common import config_args
from capsjax.config.runconfig import import_config_file

_here = pathlib.Path(__file__)
mnist = import_config_file(_here.with_name("mnist.py"))
mnist_baseline = import_config_file(_here.with_name("mnist_baseline.py"))



def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Keywords ``baseline`` and ``smoke`` (``baseline_smoke``: both, the older spelling)."""
  args = config_args.parse_arg(arg, "configs/affnist.py", baseline=False, smoke=False,
                               aliases={"baseline_smoke": "baseline,smoke"})
  smoke = args.smoke
  c = mnist.make_config(smoke=smoke)
  c.data.pad = 6             # 28x28 digits centred on 40x40.
  c.data.shift_pixels = 6    # Then moved up to 6 px: a random position on the canvas.
  if args.baseline:
    c.model = mnist_baseline.baseline_model(pool=(2, 2, 0), hidden=(847, 192))
    del c["loss"]
    if smoke:
      c.model.conv_features, c.model.hidden = (8, 8, 4), (16, 8)
      mnist.set_smoke_convolutions(c)

  c.evals.test_random_placement = ml_collections.ConfigDict(dict(
      type="randomly_shifted", split="test", seed=0))
  c.evals.affine_mnist = ml_collections.ConfigDict(dict(
      type="affine_mnist",
      transforms_per_digit=1,   # affNIST has 32 per test digit (320,000 images).
      seed=0,
      rotation_degrees=20.0,    # Uniform in +-20 degrees.
      shear=0.2,                # Shear factor uniform in +-0.2.
      scale_min=0.8, scale_max=1.2,  # Each axis.
  ))
  c.evals.affnist = ml_collections.ConfigDict(dict(
      type="affnist", path=config_dict.placeholder(str)))
  return c
