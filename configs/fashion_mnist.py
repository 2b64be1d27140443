"""Fashion-MNIST with the paper's MNIST CapsNet and training setup.

Usage:
  python -m capsjax.main --config=configs/fashion_mnist.py --workdir=/tmp/fmnist
Offline, from IDX files (Debian's dataset-fashion-mnist package puts them in
/usr/share/datasets/fashion-mnist):
  ... --config.data.source=idx --config.data.dir=/usr/share/datasets/fashion-mnist
"""

import importlib.util
import pathlib

import ml_collections

# Config files are loaded by path, so the base config is too.
_spec = importlib.util.spec_from_file_location(
    "capsjax_configs_mnist", pathlib.Path(__file__).with_name("mnist.py"))
mnist = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mnist)


def get_config(variant: str | None = None) -> ml_collections.ConfigDict:
  c = mnist.get_config(variant)
  c.data.name = "fashion_mnist"
  return c
