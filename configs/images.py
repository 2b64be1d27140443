"""Shared by configs/cifar10.py, svhn.py and smallnorb.py: the MNIST setup (optimiser,
training, evaluation, CapsNet switches) with ``config.data`` for a tfds image dataset.

Not a config by itself (``get_config`` needs the dataset's settings).
"""

import pathlib

import ml_collections
from ml_collections import config_dict

from capsjax.config.runconfig import import_config_file

mnist = import_config_file(pathlib.Path(__file__).with_name("mnist.py"))


def image_config(*, smoke: bool, dataset: str, tfds_name: str,
                 **augment) -> ml_collections.ConfigDict:
  """The MNIST config with the data of ``dataset`` (capsjax/datasets/images.py)."""
  c = mnist.make_config(smoke=smoke)
  c.dataset = dataset
  limits = {k: c.data[k] for k in ("train_limit", "test_limit") if k in c.data}  # Smoke's.
  c.data = ml_collections.ConfigDict(dict(
      source="tfds", name=tfds_name,
      dir=config_dict.placeholder(str),            # tfds's manual dir (offline).
      tfds_data_dir=config_dict.placeholder(str),  # Where tfds keeps prepared data.
      **limits, crop=0, flip=False, brightness=0.0, contrast_lower=1.0, contrast_upper=1.0,
      standardize=False,
  ))
  c.data.update(augment)
  return c
