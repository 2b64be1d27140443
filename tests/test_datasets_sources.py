"""datasets.sources: IDX and tfds reading, validation, the validation split."""

import gzip
import os

import numpy as np
import pytest

import mnist
from capsjax.common.errors import UsageError
from capsjax.datasets import sources
from helpers import write_idx, write_idx_dataset


def data_config(directory, **overrides):
  c = mnist.get_config("smoke").data
  c.source = "idx"
  c.dir = str(directory)
  c.train_limit = 0
  c.test_limit = 0
  for k, v in overrides.items():
    c[k] = v
  return c


@pytest.mark.parametrize("gz", [True, False])
def test_idx_round_trip(tmp_path, gz):
  write_idx_dataset(tmp_path, num_train=40, num_test=12, gz=gz)
  ds = sources.load(data_config(tmp_path), (28, 28, 1), 10)
  train_images = ds["train"].examples["images"]
  test_labels = ds["test"].examples["labels"]
  assert train_images.shape == (40, 28, 28, 1) and train_images.dtype == np.uint8
  assert test_labels.shape == (12,) and test_labels.dtype == np.int32
  assert len(ds["validation"]) == 0
  raw = sources.read_idx(os.path.join(tmp_path, "t10k-labels-idx1-ubyte" + (".gz" if gz else "")))
  np.testing.assert_array_equal(raw, test_labels)


def test_validation_split_is_disjoint_and_limits_apply(tmp_path):
  write_idx_dataset(tmp_path, num_train=50, num_test=20)
  ds = sources.load(data_config(tmp_path, validation_size=10, test_limit=5), (28, 28, 1), 10)
  assert len(ds["train"]) == 40 and len(ds["validation"]) == 10 and len(ds["test"]) == 5
  full = sources.load(data_config(tmp_path), (28, 28, 1), 10)
  rows = {img.tobytes() for img in full["train"].examples["images"]}
  train_rows = {img.tobytes() for img in ds["train"].examples["images"]}
  val_rows = {img.tobytes() for img in ds["validation"].examples["images"]}
  assert not train_rows & val_rows and train_rows | val_rows == rows


def test_missing_dir(tmp_path):
  with pytest.raises(UsageError, match="does not exist"):
    sources.load(data_config(tmp_path / "nope"), (28, 28, 1), 10)


def test_missing_file_names_expected_files(tmp_path):
  write_idx_dataset(tmp_path)
  os.remove(tmp_path / "t10k-labels-idx1-ubyte.gz")
  with pytest.raises(UsageError, match="t10k-labels-idx1-ubyte"):
    sources.load(data_config(tmp_path), (28, 28, 1), 10)


def test_bad_magic_names_the_path(tmp_path):
  write_idx_dataset(tmp_path)
  path = tmp_path / "train-images-idx3-ubyte.gz"
  path.write_bytes(gzip.compress(b"\x12\x34\x56\x78" + bytes(100)))
  with pytest.raises(UsageError, match=f"{path}.*bad magic"):
    sources.load(data_config(tmp_path), (28, 28, 1), 10)


def test_truncated_file(tmp_path):
  write_idx_dataset(tmp_path, gz=False)
  path = tmp_path / "train-images-idx3-ubyte"
  path.write_bytes(path.read_bytes()[:-100])
  with pytest.raises(UsageError, match="truncated or corrupt"):
    sources.load(data_config(tmp_path), (28, 28, 1), 10)


def test_corrupt_gzip(tmp_path):
  write_idx_dataset(tmp_path)
  path = tmp_path / "train-labels-idx1-ubyte.gz"
  path.write_bytes(path.read_bytes()[:20])
  with pytest.raises(UsageError, match="Cannot read IDX file"):
    sources.load(data_config(tmp_path), (28, 28, 1), 10)


def test_label_out_of_range(tmp_path):
  write_idx_dataset(tmp_path, num_train=20)
  write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.full(20, 12, np.uint8))
  with pytest.raises(UsageError, match="num_classes=10"):
    sources.load(data_config(tmp_path), (28, 28, 1), 10)


def test_count_mismatch(tmp_path):
  write_idx_dataset(tmp_path, num_train=20)
  write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(19, np.uint8))
  with pytest.raises(UsageError, match="20 train images but 19 labels"):
    sources.load(data_config(tmp_path), (28, 28, 1), 10)


def test_image_shape_mismatch_names_config_key(tmp_path):
  write_idx_dataset(tmp_path)
  with pytest.raises(UsageError, match="config.model.image_shape"):
    sources.load(data_config(tmp_path), (36, 36, 1), 10)


def test_unknown_source(tmp_path):
  with pytest.raises(UsageError, match=r"source='csv' is out of range: it must be one of \('tfds', 'idx'\)"):
    sources.load(data_config(tmp_path, source="csv"), (28, 28, 1), 10)


def test_unknown_tfds_name():
  c = data_config("", source="tfds", name="no_such_dataset_xyz")
  with pytest.raises(UsageError, match="Unknown tensorflow-datasets name"):
    sources.load(c, (28, 28, 1), 10)


SHARED_MNIST = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "mnist")


@pytest.mark.skipif(not os.path.isdir(SHARED_MNIST), reason="needs ../shared/data/mnist")
def test_tfds_offline_from_manual_dir_matches_idx(tmp_path, monkeypatch):
  """tfds prepares MNIST offline from the original archives (it checks their checksums); the
  same digits as the idx source. tfds writes the first 1,000 of each split only
  (``max_examples_per_split``, its option for tests): all 70,000 took 36 s of a test run."""
  import functools

  import tensorflow_datasets as tfds

  monkeypatch.setattr(tfds.download, "DownloadConfig", functools.partial(
      tfds.download.DownloadConfig, max_examples_per_split=1000))
  c = data_config(SHARED_MNIST, source="tfds", name="mnist", tfds_data_dir=str(tmp_path))
  from_tfds = sources.load(c, (28, 28, 1), 10)
  from_idx = sources.load(data_config(SHARED_MNIST), (28, 28, 1), 10)
  for split in ("train", "test"):
    images, labels = (from_tfds[split].examples[k] for k in ("images", "labels"))
    assert images.shape == (1000, 28, 28, 1) and images.dtype == np.uint8
    # tfds wrote the files' first 1,000 digits in an order of its own: the same digits.
    expected = {k: from_idx[split].examples[k][:1000] for k in ("images", "labels")}
    np.testing.assert_array_equal(np.bincount(labels, minlength=10),
                                  np.bincount(expected["labels"], minlength=10))
    assert digits(images, labels) == digits(expected["images"], expected["labels"]), split


def digits(images, labels) -> list:
  """The (label, pixels) pairs of a split, in an order that does not depend on the split's."""
  return sorted(zip(labels.tolist(), (image.tobytes() for image in images)))


def test_offline_advice_names_what_each_dataset_can_use():
  import types

  cifar = types.SimpleNamespace(url_infos={"https://www.cs.toronto.edu/~kriz/"
                                           "cifar-10-binary.tar.gz": None})
  hint = sources.offline_hint(cifar, idx_ok=False)
  assert "cifar-10-binary.tar.gz" in hint and "--config.data.tfds_data_dir" in hint
  assert "source=idx" not in hint  # CIFAR-10 cannot be read from IDX files.
  assert "--config.data.source=idx" in sources.offline_hint(cifar, idx_ok=True)


def test_a_manual_dir_without_the_archives_fails_at_once_naming_them(tmp_path, caplog):
  """Without this check tfds would try to download them, retrying for minutes offline. And
  tfds's own "Variant folder ... has no dataset_info.json" is not shown before the error."""
  (tmp_path / "manual").mkdir()
  c = data_config(str(tmp_path / "manual"), source="tfds", name="mnist",
                  tfds_data_dir=str(tmp_path / "prepared"))
  with pytest.raises(UsageError, match=r"lacks the files tfds needs for 'mnist': "
                                       r"t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz, "
                                       r"train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz"):
    sources.load(c, (28, 28, 1), 10)
  assert not [r for r in caplog.records if "dataset_info.json" in r.getMessage()]
