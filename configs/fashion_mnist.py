"""Fashion-MNIST with the paper's MNIST CapsNet and training setup.

Usage:
  python -m capsjax.main --config=configs/fashion_mnist.py --workdir=/tmp/fmnist
Offline, from IDX files (Debian's dataset-fashion-mnist package puts them in
/usr/share/datasets/fashion-mnist):
  ... --config.data.source=idx --config.data.dir=/usr/share/datasets/fashion-mnist
"""

import pathlib

import ml_collections

from capsjax.runconfig import import_config_file

mnist = import_config_file(pathlib.Path(__file__).with_name("mnist.py"))


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
  c = mnist.get_config(variant)
  c.data.name = "fashion_mnist"
  return c
