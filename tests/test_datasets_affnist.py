"""datasets.affnist: the MATLAB reader on small files written in affNIST's layout."""

import numpy as np
import pytest
import scipy.io

from capsjax.common.errors import UsageError
from capsjax.datasets import affnist
from helpers import write_affnist


def sample(n, seed):
  rng = np.random.default_rng(seed)
  return rng.integers(0, 256, (n, 40, 40), dtype=np.uint8), rng.integers(0, 10, n)


def test_reads_a_file_in_the_real_layout(tmp_path):
  images, labels = sample(5, 0)
  write_affnist(tmp_path / "test.mat", images, labels)
  got_images, got_labels = affnist.load(str(tmp_path / "test.mat"))
  assert got_images.shape == (5, 40, 40, 1) and got_images.dtype == np.uint8
  np.testing.assert_array_equal(got_images[..., 0], images)
  np.testing.assert_array_equal(got_labels, labels)
  assert got_labels.dtype == np.int32


def test_reads_a_folder_of_batches_in_numeric_order(tmp_path):
  parts = [sample(n, seed) for seed, n in enumerate((3, 2, 4))]
  for name, (images, labels) in zip(("1.mat", "2.mat", "10.mat"), parts):
    write_affnist(tmp_path / name, images, labels)
  images, labels = affnist.load(str(tmp_path))
  np.testing.assert_array_equal(images[..., 0], np.concatenate([p[0] for p in parts]))
  np.testing.assert_array_equal(labels, np.concatenate([p[1] for p in parts]))


def test_clear_errors_name_the_path(tmp_path):
  with pytest.raises(UsageError, match=f"{tmp_path / 'missing.mat'} not found"):
    affnist.load(str(tmp_path / "missing.mat"))
  scipy.io.savemat(tmp_path / "other.mat", {"something": np.zeros(3)})
  with pytest.raises(UsageError, match=r"other.mat has no struct 'affNISTdata'"):
    affnist.load(str(tmp_path / "other.mat"))
  scipy.io.savemat(tmp_path / "nolabels.mat", {"affNISTdata": {"image": np.zeros((1600, 2))}})
  with pytest.raises(UsageError, match=r"nolabels.mat: the struct affNISTdata lacks \['label_int'\]"):
    affnist.load(str(tmp_path / "nolabels.mat"))
  images, labels = sample(3, 1)
  write_affnist(tmp_path / "range.mat", images, labels, label_int=np.array([[1, 12, 3]]))
  with pytest.raises(UsageError, match=r"range.mat: labels lie in \[1, 12\]"):
    affnist.load(str(tmp_path / "range.mat"))
  scipy.io.savemat(tmp_path / "shape.mat", {"affNISTdata": {"image": np.zeros((784, 2)),
                                                            "label_int": np.zeros((1, 2))}})
  with pytest.raises(UsageError, match=r"shape.mat: affNISTdata.image has shape \(784, 2\)"):
    affnist.load(str(tmp_path / "shape.mat"))
  (tmp_path / "junk.mat").write_bytes(b"not a mat file at all")
  with pytest.raises(UsageError, match="junk.mat as a MATLAB file"):
    affnist.load(str(tmp_path / "junk.mat"))
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(UsageError, match="holds no .mat files"):
    affnist.load(str(empty))


def test_an_asymmetric_digit_reads_the_right_way_up(tmp_path):
  """An 'L' written pixel by pixel in the files' documented layout (affNISTdata.image is
  1600 x N, one image per column, pixel (row r, column c) at entry 40 * r + c; Kaggle's
  affNIST reader and the dataset page read it so), independently of capsjax's reader: a
  transposed or flipped reader cannot pass."""
  column = np.zeros(1600, np.uint8)
  for r in range(5, 35):            # The stem: column 8, rows 5-34, top to bottom.
    column[40 * r + 8] = 255
  for c in range(8, 28):            # The foot: row 34, columns 8-27, to the right.
    column[40 * 34 + c] = 255
  scipy.io.savemat(tmp_path / "l.mat", {"affNISTdata": {
      "image": column[:, None], "label_int": np.array([[1]], np.uint8)}})
  image = affnist.load(str(tmp_path / "l.mat"))[0][0, :, :, 0]
  assert np.all(image[5:35, 8] == 255) and np.all(image[34, 8:28] == 255)   # Stem, foot.
  assert image.sum() == 255 * (30 + 19)                                      # Nothing else.
  assert image[:20, 20:].sum() == 0 and image[5, 8] == 255 and image[34, 27] == 255
