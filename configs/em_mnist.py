"""Matrix capsules with EM routing (Hinton, Sabour & Frosst 2018) on MNIST: the smallNORB
network of the authors' code (capsjax/models/em_capsnet.py) on 28x28 digits, one channel.

Usage:
  python -m capsjax.main --config=configs/em_mnist.py --workdir=/tmp/em_mnist \\
      --config.data.source=idx --config.data.dir=/path/to/mnist
  python -m capsjax.main --config=configs/em_mnist.py:small --workdir=/tmp/em_small
  python -m capsjax.main --config=configs/em_mnist.py:smoke --workdir=/tmp/smoke
  python -m capsjax.main --config=configs/em_mnist.py:vb --workdir=/tmp/vb_mnist

Variants (keywords after ':'):
  (none)  A=B=C=D=32 (318,420 parameters with 10 classes and one channel): conv1 5x5 stride 2
          (28 -> 12), primary capsules, ConvCaps1 K=3 stride 2 (-> 5), ConvCaps2 K=3 stride 1
          (-> 3), class capsules; 3 EM iterations; spread loss on the code's margin schedule;
          Adam 0.01 (the code's rate) decayed 0.96 every 20,000 steps (not staircase); batch 64;
          random shifts of up to 2 px (the code's MNIST input without ``distort``).
  small   A=64, B=8, C=D=16, the paper's small network (68,308 parameters here).
  smoke   tiny types, a few steps on a small slice (tests).
  vb      variational Bayes routing (Ribeiro et al. 2020) on the same layers, trained as its
          authors' code: the small network, cross-entropy on the class activations, Adam
          1e-3 constant, batch 128 (with smoke: the smoke sizes). For EM against VB with all
          else equal: --config.model.routing.name=variational_bayes on any variant.

The paper reports 0.44% MNIST test error; the code trains for up to 2,000,000 steps.
"""

import pathlib

import ml_collections

from capsjax.common import config_args
from capsjax.config.runconfig import import_config_file

mnist = import_config_file(pathlib.Path(__file__).with_name("mnist.py"))


def em_model(*, conv1=32, primary=32, caps=(32, 32)) -> ml_collections.ConfigDict:
  """``config.model`` of em_capsnet with the authors' code's settings; image shape and
  classes come from the dataset."""
  model = ml_collections.ConfigDict()
  model.name = "em_capsnet"
  model.image_shape = ml_collections.config_dict.placeholder(tuple)
  model.num_classes = ml_collections.config_dict.placeholder(int)
  model.pose_size = 4
  model.conv1 = ml_collections.ConfigDict(dict(
      features=conv1, kernel_size=5, stride=2, init_scale=0.05, bias_init=0.1))
  model.primary = ml_collections.ConfigDict(dict(
      types=primary, pose_init=0.5, activation_init=3.0, activation_offset=1.0,
      layout="code"))           # "split": poses and logits from their own kernels.
  model.conv_caps = ml_collections.ConfigDict(dict(
      types=tuple(caps), kernel_sizes=(3, 3), strides=(2, 1),
      init_scale=0.3,            # The code's kernel std.
      normalisation="code",      # "child" (the paper's EM) | "patch" (reimplementations).
      inverse_temperature=0.01,  # The code's final_beta.
      mass_epsilon=1e-7,
      beta_u_init=0.5, beta_a_init=0.5))
  model.class_capsules = ml_collections.ConfigDict(dict(
      init_scale=0.01,
      coordinate_addition="code"))  # "paper" | "none".
  # The class layer's router: EM routing at its defaults, the authors' code's (inverse
  # temperature 0.01 / 4, ...: capsjax/routing/em.py SETTINGS).
  model.routing = ml_collections.ConfigDict(dict(name="em"))
  model.conv_impl = "auto"
  return model


def code_training(c: ml_collections.ConfigDict, *, small: bool, smoke: bool) -> None:
  """The model of the variant, the spread loss, and the code's Adam: 0.01 (its flag default)
  decayed 0.96 every 20,000 steps, not staircase; batch 64 (smoke: the smoke batch)."""
  c.model = em_model(conv1=64, primary=8, caps=(16, 16)) if small else em_model()
  if smoke:
    c.model = em_model(conv1=8, primary=4, caps=(4, 4))
    mnist.set_smoke_convolutions(c)
  # The authors' code's spread loss (its margin schedule, the mean over classes, weight decay
  # 2e-7): the declared defaults (capsjax/models/em_capsnet.py LOSS_SETTINGS).
  c.loss = ml_collections.ConfigDict()
  c.optimizer.update(dict(learning_rate=0.01, decay_rate=0.96, decay_steps=20_000))
  if not smoke:
    c.train.batch_size = 64
    c.eval.batch_size = 100


def vb_training(c: ml_collections.ConfigDict, *, smoke: bool) -> None:
  """Variational Bayes routing as its authors' code trains it (fabio-deep/Variational-Capsule-
  Routing, ``main.py`` defaults): the small network (A=64, B=8, C=D=16), softmax
  cross-entropy over the class activations, Adam 1e-3 without decay, batch 128."""
  if not smoke:
    c.model = em_model(conv1=64, primary=8, caps=(16, 16))
    c.train.batch_size = 128
  c.model.routing.name = "variational_bayes"
  c.loss.kind = "cross_entropy"
  c.loss.weight_decay = 0.0
  c.optimizer.update(dict(learning_rate=1e-3, schedule="constant", decay_rate=None,
                          decay_steps=None))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = config_args.parse_arg(arg, "configs/em_mnist.py", small=False, smoke=False, vb=False)
  c = mnist.make_config(smoke=args.smoke)
  code_training(c, small=args.small, smoke=args.smoke)
  if args.vb:
    vb_training(c, smoke=args.smoke)
  c.train.num_epochs = 20
  return c
