"""Which published dataset a folder of IDX files holds, by the SHA-256 of their contents.

``configs/fashion_mnist.py`` pointed at a folder of MNIST files trains on digits, and nothing
in the run said so. The IDX files of MNIST and Fashion-MNIST are told apart here by the
SHA-256 of their decompressed contents (so raw and gzip files, and archives re-compressed by
a packager, all match):

* MNIST: the contents of the archives whose SHA-256 tensorflow-datasets publishes
  (``url_checksums/mnist.txt``; e.g. train-images-idx3-ubyte.gz 440fcabf...).
* Fashion-MNIST: the contents of Debian's ``dataset-fashion-mnist`` package
  (0.0~git20200523), whose archives are the published ones re-compressed (their gzip headers
  differ, so the archive checksums of ``url_checksums/fashion_mnist.txt`` do not apply).

A file that matches neither (generated test data, another dataset) is not reported.
"""

from __future__ import annotations

import hashlib

import numpy as np

# SHA-256 of the decompressed train-images-idx3-ubyte of each dataset.
TRAIN_IMAGES_SHA256 = {
    "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db": "mnist",
    "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888": "fashion_mnist",
}


def idx_bytes(array: np.ndarray) -> bytes:
  """The IDX file (unsigned bytes) that :func:`capsjax.datasets.sources.read_idx` reads into
  ``array``: magic ``00 00 08 ndim``, the dimensions as big-endian int32, the data."""
  header = b"\0\0\x08" + bytes([array.ndim]) + b"".join(
      int(d).to_bytes(4, "big") for d in array.shape)
  return header + np.ascontiguousarray(array, np.uint8).tobytes()


def identify(train_images: np.ndarray) -> str | None:
  """``"mnist"``, ``"fashion_mnist"`` or None: the published dataset whose train images these
  are, ``(n, h, w)`` uint8 as read from the IDX file."""
  return TRAIN_IMAGES_SHA256.get(hashlib.sha256(idx_bytes(train_images)).hexdigest())


def mismatch_warning(expected: str | None, train_images: np.ndarray, directory: str) -> str | None:
  """A warning when the files in ``directory`` are a known dataset other than ``expected``
  (``config.data.name``); None when they match or are not known."""
  found = identify(train_images)
  if found is None or expected is None or found == expected:
    return None
  return (f"Warning: config.data.name is {expected!r} but the IDX files in {directory} are "
          f"{found!r} (by the SHA-256 of train-images-idx3-ubyte): this run trains and tests "
          f"on {found}. Point --config.data.dir at the {expected} files, or use the config "
          f"of {found}.")
