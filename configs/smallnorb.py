"""smallNORB (paper Sec. 7): the MNIST CapsNet on the two stereo views, 5 categories.

Usage:
  python -m capsjax.main --config=configs/smallnorb.py --workdir=/tmp/smallnorb
Offline: --config.data.dir=DIR with tfds's smallnorb files (the six
smallnorb-5x46789x9x18x6x2x96x96-*.mat.gz and smallnorb-5x01235x9x18x6x2x96x96-*.mat.gz).

Paper: 2.7% test error, "same architecture as MNIST", images "resized to
48x48" and trained on random 32x32 crops, tested on the central 32x32 patch.
Sources: paper for those; official code (norb_input_record.py) for the rest:
the two views as two channels, random brightness +-63 and contrast 0.2-1.8
before the crop, per-image standardisation (train and test), the decoder on,
reconstructing the standardised image (remake stays on by default there).
Resizing 96 -> 48 averages 2x2 blocks here (the official code: TF's bilinear
resize). 9,327,104 parameters.

Cost: XLA counts 2.2 GFLOP per training image
(python -m capsjax.benchmark --config=configs/smallnorb.py); the README's
Performance table has its speed on the machines we measured.

Variant ``smoke``: a tiny model for a few steps (tests, on tfds.testing.mock_data).
"""

import pathlib

import ml_collections

from capsjax.common import config_args
from capsjax.runs.runconfig import import_config_file

images = import_config_file(pathlib.Path(__file__).with_name("images.py"))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  smoke = config_args.parse_arg(arg, "configs/smallnorb.py", smoke=False).smoke
  return images.image_config(smoke=smoke, dataset="smallnorb", tfds_name="smallnorb", resize=48,
                             crop=32, brightness=63.0, contrast_lower=0.2, contrast_upper=1.8,
                             standardize=True)
