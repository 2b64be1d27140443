"""SVHN (paper Sec. 7): a smaller CapsNet on the 73,257 cropped-digit training images.

Usage:
  python -m capsjax.main --config=configs/svhn.py --workdir=/tmp/svhn
Offline: --config.data.dir=DIR with tfds's svhn_cropped files (train_32x32.mat, test_32x32.mat,
extra_32x32.mat).

Paper: 4.3% test error with "the number of first convolutional layer channels
[reduced] to 64, the primary capsule layer to 16 6D-capsules with 8D final
capsule layer". Sources: paper for those sizes and 3 routing iterations; the
official code has no SVHN setup, so everything else is the MNIST setup
(VALID padding, 9x9 kernels, margin loss, the decoder of 512 and 1024 units on
the masked class capsules, reconstruction weight 0.0005, Adam 1e-3 decayed
0.96 every 2000 steps, batch 128), with the 32x32 RGB images in [0, 1] and no
augmentation (the paper names none). 4,720,480 parameters.

Cost: XLA counts 0.265 GFLOP per training image
(python -m capsjax.benchmark --config=configs/svhn.py);
docs/performance.md has its speed on the machines we measured.

Variant ``smoke``: a tiny model for a few steps (tests, on tfds.testing.mock_data).
"""

import pathlib

import ml_collections

from capsjax.common import config_args
from capsjax.config.runconfig import import_config_file

images = import_config_file(pathlib.Path(__file__).with_name("images.py"))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  smoke = config_args.parse_arg(arg, "configs/svhn.py", smoke=False).smoke
  c = images.image_config(smoke=smoke, dataset="svhn", tfds_name="svhn_cropped")
  if not smoke:
    c.model.conv1.features = 64        # Paper.
    c.model.primary.num_types = 16     # Paper.
    c.model.primary.dim = 6            # Paper.
    c.model.class_capsules.dim = 8     # Paper.
  return c
