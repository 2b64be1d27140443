"""The examples of this folder in one config: a researcher's own model, router, evaluator and
dataset, each named by import path, none registered in capsjax.

    python -m capsjax.main --config=examples/config.py:model,router,evaluator,dataset \
        --workdir=/tmp/examples        # all four; offline (the dataset is generated)
    python -m capsjax.main --config=examples/config.py:router --workdir=/tmp/ex_router \
        --config.data.source=idx --config.data.dir=/path/to/mnist   # one, on MNIST

Keywords (capsjax/common/config_args.py), each off by default; with none this is
``configs/mnist.py:smoke`` run for ``steps``:

  model      examples/tiny_capsnet.py:TinyCapsNet, a tiny capsule network with a spread loss
             whose margin follows the training step;
  router     examples/agreement_router.py:ROUTER, one pass of agreement with a temperature
             (``config.model.routing.temperature``);
  evaluator  examples/input_gradients.py:FGSM, accuracy under FGSM (``config.evals.fgsm``);
  dataset    examples/bars_dataset.py:Bars, generated bars of four orientations;
  steps=N    training steps (default 300).

The names are absolute paths of the files beside this one, so the config runs from any working
directory; in one's own config a path relative to the working directory, or a module on
``PYTHONPATH`` (``"my_models:TinyCapsNet"``), works the same.
"""

import pathlib

import ml_collections
from ml_collections import config_dict

from capsjax.common import config_args
from capsjax.config.runconfig import import_config_file

_HERE = pathlib.Path(__file__).resolve().parent
mnist = import_config_file(_HERE.parent / "configs" / "mnist.py")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = config_args.parse_arg(arg, "examples/config.py", model=False, router=False,
                               evaluator=False, dataset=False, steps=300)
  c = mnist.make_config(smoke=True)
  c.train.num_steps = args.steps
  c.train.log_every_steps = max(1, args.steps // 10)
  c.train.checkpoint_every_steps = max(1, args.steps // 2)

  if args.dataset:
    c.dataset = f"{_HERE / 'bars_dataset.py'}:Bars"
    c.data = ml_collections.ConfigDict(dict(
        size=28, noise=40.0, num_train=4096, num_test=512, seed=0,
        validation_size=0, test_limit=0))

  if args.model:
    c.model = ml_collections.ConfigDict(dict(
        name=f"{_HERE / 'tiny_capsnet.py'}:TinyCapsNet",
        image_shape=config_dict.placeholder(tuple),
        num_classes=config_dict.placeholder(int),
        features=32, types=8, dim=8, class_dim=8,
        margin_steps=max(1, args.steps // 2),  # The spread loss's margin: 0.2 -> 0.9.
        routing=dict(name="dynamic"),
    ))
    del c["loss"]  # CapsNet's margin loss; TinyCapsNet has its own.

  if args.router:
    c.model.routing.name = f"{_HERE / 'agreement_router.py'}:ROUTER"
    c.model.routing.temperature = config_dict.placeholder(float)  # Unset: the router's 1.0.

  if args.evaluator:
    c.evals.fgsm = ml_collections.ConfigDict(dict(
        type=f"{_HERE / 'input_gradients.py'}:FGSM", epsilon=0.1))
  return c
