"""The paper's baseline CNN (Sec. 5, Table 1) on MNIST, trained like configs/mnist.py.

Usage:
  python -m capsjax.main --config=configs/mnist_baseline.py --workdir=/tmp/baseline
  python -m capsjax.main --config=configs/mnist_baseline.py:smoke --workdir=/tmp/smoke

Three 5x5 stride-1 SAME convolutions with 256, 256 and 128 channels (ReLU),
fully connected layers of 328 and 192 (ReLU), dropout, a 10-way softmax with
cross-entropy: 35,445,522 parameters at 28x28x1 (the paper: 35.4M). Data,
random shifts of up to 2 px, Adam and its decay, batch 128: the same as
configs/mnist.py. The paper gives no dropout rate or initialisation: 0.5 and
LeCun normal here. Paper result: 0.39% test error (Table 1).

Variants: (none) the paper's baseline; official: the baseline of the authors' code
(models/conv_model.py, run by its README's `--model=baseline` with the default hparams): two
5x5 VALID convolutions of 512 and 256 channels, each followed by 2x2 max pooling, a hidden
layer of 1,024, no dropout, truncated-normal inits (0.05 convolutions, 0.1 dense), biases 0.1,
and the margin loss on the raw logits (loss_type='margin'), with the optimiser and validation
split of configs/mnist.py:official; 7,495,946 parameters; smoke: a tiny one for a few steps.
"""

import pathlib

import ml_collections
from ml_collections import config_dict

from capsjax.common import config_args
from capsjax.config.runconfig import import_config_file

mnist = import_config_file(pathlib.Path(__file__).with_name("mnist.py"))


def baseline_model(**overrides) -> ml_collections.ConfigDict:
  """``config.model`` of the baseline CNN (capsjax/models/baseline_cnn.py); the image shape
  and the classes come from the dataset."""
  model = ml_collections.ConfigDict(dict(
      name="baseline_cnn",
      image_shape=config_dict.placeholder(tuple),
      num_classes=config_dict.placeholder(int),
      conv_features=(256, 256, 128),  # 5x5, stride 1, SAME, ReLU.
      kernel_size=5,
      pool=(0, 0, 0),                 # Max pooling after each conv (0 or 1: none).
      hidden=(328, 192),              # Fully connected, ReLU.
      dropout_rate=0.5,               # Before the softmax layer; the paper gives no rate.
      padding="SAME",                 # Of the convolutions; the official code's: VALID.
      init_scale=0.0,                 # 0: LeCun normal; >0: normal(0, s) cut at 2 std.
      dense_init_scale=config_dict.placeholder(float),  # None: init_scale.
      bias_init=0.0,                  # Every bias; the official code's 0.1.
      loss="cross_entropy",           # Or "margin": the official code's, on the raw logits.
      conv_impl="auto",
      compute_dtype="float32",
  ))
  model.update(overrides)
  return model


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  return make_config(**config_args.parse_arg(arg, "configs/mnist_baseline.py", smoke=False,
                                             official=False))


def official_model() -> ml_collections.ConfigDict:
  """The official code's baseline (models/conv_model.py; variables.py's weight_variable and
  bias_variable; experiment.py's default_hparams: padding VALID, loss_type margin)."""
  return baseline_model(conv_features=(512, 256), pool=(2, 2), hidden=(1024,),
                        dropout_rate=0.0, padding="VALID", init_scale=0.05,
                        dense_init_scale=0.1, bias_init=0.1, loss="margin")


def make_config(*, smoke: bool = False, official: bool = False) -> ml_collections.ConfigDict:
  c = mnist.make_config(smoke=smoke, official=official)
  c.model = official_model() if official else baseline_model()
  del c["loss"]  # CapsNet's margin/reconstruction settings; the baseline uses cross-entropy.
  # On a CPU the 5x5x256 convolutions run as im2col: 20 MB of patches per 28x28 image, so
  # 500-image evaluation batches would need 10 GB. The batch size does not change results.
  c.eval.batch_size = 100
  if smoke:
    c.model.conv_features = (8, 4) if official else (8, 8, 4)
    c.model.hidden = (16,) if official else (16, 8)
    mnist.set_smoke_convolutions(c)
  return c
