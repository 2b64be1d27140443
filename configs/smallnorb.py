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
(python -m capsjax.benchmark --config=configs/smallnorb.py);
docs/performance.md has its speed on the machines we measured.

Variants (keywords after ':', any together):
  smoke      a tiny model for a few steps (tests, on tfds.testing.mock_data)
  baseline   the baseline CNN of configs/mnist_baseline.py instead of CapsNet
  azimuth    the novel-viewpoint split of Hinton et al. 2018 (Sec. 5.1): train on azimuths
             300-40 degrees, test on them (test) and on 60-280 (novel_viewpoints)
  elevation  the same with the 3 lowest elevations against the 6 higher
With a viewpoint split, 10% of the familiar-view training images are held out as validation
(the set that matched comparisons choose on: experiments/smallnorb_viewpoints.py).
"""

import pathlib

import ml_collections

from capsjax.common import config_args
from capsjax.config.runconfig import import_config_file

images = import_config_file(pathlib.Path(__file__).with_name("images.py"))
mnist_baseline = import_config_file(pathlib.Path(__file__).with_name("mnist_baseline.py"))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = config_args.parse_arg(arg, "configs/smallnorb.py", smoke=False, baseline=False,
                               azimuth=False, elevation=False)
  if args.azimuth and args.elevation:
    raise ValueError("configs/smallnorb.py: choose one of the variants azimuth and elevation.")
  c = images.image_config(smoke=args.smoke, dataset="smallnorb", tfds_name="smallnorb",
                          resize=48, crop=32, brightness=63.0, contrast_lower=0.2,
                          contrast_upper=1.8, standardize=True)
  c.data.viewpoint_split = "azimuth" if args.azimuth else "elevation" if args.elevation else ""
  if args.baseline:
    smoke_model = mnist_baseline.make_config(smoke=True).model
    c.model = mnist_baseline.baseline_model(
        **({k: smoke_model[k] for k in ("conv_features", "hidden")} if args.smoke else {}))
    del c["loss"]
    c.eval.batch_size = 100
    if args.smoke:
      mnist_baseline.mnist.set_smoke_convolutions(c)
  if c.data.viewpoint_split:
    # 24,300 training images, a third (azimuth) or three ninths (elevation) familiar.
    c.data.validation_size = 20 if args.smoke else 810
    c.evals.novel_viewpoints = dict(type="split", split="novel_viewpoints")
    c.train.eval_during = ("novel_viewpoints",)  # Its curve, for matched comparisons.
  return c
