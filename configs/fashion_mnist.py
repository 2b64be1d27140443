"""Fashion-MNIST with the paper's MNIST CapsNet and training setup.

Usage:
  python -m capsjax.main --config=configs/fashion_mnist.py --workdir=/tmp/fmnist
Offline, from IDX files (Debian's dataset-fashion-mnist package puts them in
/usr/share/datasets/fashion-mnist):
  ... --config.data.source=idx --config.data.dir=/usr/share/datasets/fashion-mnist
"""

import pathlib

import ml_collections

from capsjax.common import config_args
from capsjax.config.runconfig import import_config_file

mnist = import_config_file(pathlib.Path(__file__).with_name("mnist.py"))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = mnist.make_config(**config_args.parse_arg(arg, "configs/fashion_mnist.py", smoke=False))
  c.data.name = "fashion_mnist"
  return c
