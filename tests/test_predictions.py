"""capsjax/runs/predictions.py: what a run keeps of each example, written and read back;
Split ids through sampling and the validation hold-out."""

import pathlib
import struct
import zipfile
import zlib

import numpy as np
import pytest

from capsjax import datasets
from capsjax.common.errors import UsageError
from capsjax.datasets import sources
from capsjax.runs import predictions

from helpers import write_idx_dataset


def split_of(n: int, ids=None, source_size=None) -> datasets.Split:
  rng = np.random.default_rng(0)
  return datasets.Split({"images": rng.integers(0, 256, (n, 4, 4, 1), dtype=np.uint8),
                         "labels": rng.integers(0, 10, n).astype(np.int32)},
                        ids=ids, source_size=source_size)


def test_of_records_ids_predictions_correctness_and_the_wrong_images():
  split = split_of(6, ids=np.array([3, 9, 11, 20, 21, 40]), source_size=50)
  labels = split.examples["labels"]
  scores = np.eye(10, dtype=np.float32)[labels]
  scores[[1, 4]] = np.eye(10, dtype=np.float32)[(labels[[1, 4]] + 3) % 10]  # Two wrong.
  correct = np.array([1, 0, 1, 1, 0, 1], np.float32)
  p = predictions.Predictions.of(split, scores, correct, labels)
  np.testing.assert_array_equal(p.id, [3, 9, 11, 20, 21, 40])
  np.testing.assert_array_equal(p.predicted[[0, 2, 3, 5]], labels[[0, 2, 3, 5]])
  np.testing.assert_array_equal(p.predicted[[1, 4]], (labels[[1, 4]] + 3) % 10)
  np.testing.assert_array_equal(p.wrong_ids, [9, 21])
  np.testing.assert_array_equal(p.wrong_images, split.examples["images"][[1, 4]])
  assert p.source_size == 50 and p.correct.dtype == bool and p.correct.sum() == 4


def test_predicted_classes_break_ties_to_the_lower_class_and_give_the_top_k():
  scores = np.array([[0.1, 0.5, 0.5, 0.2], [0.9, 0.1, 0.3, 0.8]])
  np.testing.assert_array_equal(predictions.predicted_classes(scores), [1, 0])
  np.testing.assert_array_equal(predictions.predicted_classes(scores, 2), [[1, 2], [0, 3]])


def test_digests_tell_inputs_apart_and_agree_on_equal_ones():
  images = np.zeros((3, 4, 4, 1), np.uint8)
  images[1, 0, 0, 0] = 1
  labels = np.array([3, 3, 3])
  d = predictions.digests({"images": images, "labels": labels})
  assert d.dtype == np.uint64 and d[0] == d[2] and d[0] != d[1]
  relabelled = predictions.digests({"images": images, "labels": np.array([3, 3, 4])})
  assert relabelled[0] == d[0] and relabelled[2] != d[2]
  pairs = predictions.digests({"first": np.array([0, 5]), "second": np.array([5, 0])})
  assert pairs[0] != pairs[1]  # MultiMNIST's examples: pairs of digit indices.


def test_written_and_read_back(tmp_path):
  split = split_of(5)
  p = predictions.Predictions.of(split, np.random.default_rng(1).random((5, 10)),
                                 np.array([1, 1, 0, 1, 0]), split.examples["labels"])
  path = str(tmp_path / "predictions.npz")
  predictions.write(path, {"test": p}, step=7, selected_on="final", source="idx")
  found, meta = predictions.read(path)
  assert meta["step"] == 7 and meta["format"] == predictions.FORMAT
  assert meta["evaluations"] == {"test": {"size": 5, "source_size": 5}}
  for field in predictions.FIELDS:
    np.testing.assert_array_equal(getattr(found["test"], field), getattr(p, field), field)


def test_missing_and_damaged_files_are_usage_errors(tmp_path):
  with pytest.raises(UsageError, match="does not exist.*capsjax.evaluate --workdir="):
    predictions.read(str(tmp_path / "predictions.npz"))
  (tmp_path / "predictions.npz").write_bytes(b"PK\x03\x04 not a zip")
  with pytest.raises(UsageError, match="damaged or not a capsjax predictions file"):
    predictions.read(str(tmp_path / "predictions.npz"))


def test_a_file_damaged_inside_is_a_usage_error(tmp_path):
  """Bytes overwritten in the middle of the compressed arrays, the zip's directory intact
  (zlib's error while decompressing, not the zip's)."""
  n = 2000
  split = split_of(n)
  rng = np.random.default_rng(0)
  p = predictions.Predictions.of(split, rng.random((n, 10)), rng.integers(0, 10, n),
                                 split.examples["labels"])
  path = str(tmp_path / "predictions.npz")
  predictions.write(path, {"test": p}, step=1, selected_on="final", source="idx")
  data = bytearray(pathlib.Path(path).read_bytes())
  with zipfile.ZipFile(path) as archive:
    start = archive.getinfo("test/scores.npy").header_offset
  # The member's deflate stream begins after its local header (30 bytes, its name, its extra
  # field); a first block of the reserved type 3 is what zlib refuses ("invalid block type").
  name_length, extra_length = struct.unpack("<HH", data[start + 26:start + 30])
  data[start + 30 + name_length + extra_length] = 0b111
  pathlib.Path(path).write_bytes(bytes(data))
  with pytest.raises(UsageError, match="damaged or not a capsjax predictions file") as raised:
    predictions.read(path)
  assert isinstance(raised.value.__cause__, zlib.error)  # What this damage raises inside.


def test_ids_follow_examples_through_limits_and_the_validation_split(tmp_path):
  """Each example's id is its position in the IDX file, through test_limit's sample and the
  held-out validation split."""
  import mnist

  data = mnist.get_config("smoke").data
  data.source, data.dir = "idx", str(write_idx_dataset(tmp_path, num_train=40, num_test=30))
  data.validation_size, data.test_limit, data.train_limit = 8, 12, 0
  splits = sources.load(data, (28, 28, 1), 10)
  full = sources.read_idx(str(next(tmp_path.glob("t10k-images*"))))
  test = splits["test"]
  assert test.source_count() == 30 and len(test) == 12
  np.testing.assert_array_equal(test.examples["images"][..., 0], full[test.ids])
  train_file = sources.read_idx(str(next(tmp_path.glob("train-images*"))))
  for name in ("train", "validation"):
    np.testing.assert_array_equal(splits[name].examples["images"][..., 0],
                                  train_file[splits[name].ids], name)
  assert sorted(np.concatenate([splits["train"].ids, splits["validation"].ids])) == list(range(40))


def test_file_order_settings_are_refused_with_tensorflow_datasets():
  import mnist

  data = mnist.get_config("official").data
  assert data.source == "tfds" and data.validation_split == "first"
  sources.check_file_order(data)  # No validation split held out: nothing assumes the order.
  data.validation_size = 10_000
  with pytest.raises(UsageError, match="validation_split='first'.*--config.data.source=idx.*"
                                       "--config.data.validation_split=random"):
    sources.check_file_order(data)
  data.validation_size, data.order = 0, "stream"
  with pytest.raises(UsageError, match="order='stream'.*hash of their key"):
    sources.check_file_order(data)
  data.source = "idx"
  sources.check_file_order(data)
