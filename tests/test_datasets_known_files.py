"""known_files: a folder of IDX files is recognised as MNIST or Fashion-MNIST by the SHA-256
of its contents, and a config that names the other dataset gets a warning naming both."""

import gzip
import hashlib
import os

import pytest

import fashion_mnist
import mnist

from capsjax.datasets import known_files, sources
from helpers import write_idx_dataset

MNIST_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "mnist")
FASHION_DIR = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist.


def data_config(config, directory):
  c = config.get_config("smoke").data
  c.source, c.dir, c.train_limit, c.test_limit = "idx", str(directory), 0, 0
  return c


@pytest.mark.parametrize("gz", [True, False])
def test_the_hash_is_of_the_file_contents_raw_or_gzip(tmp_path, gz):
  write_idx_dataset(tmp_path, num_train=40, num_test=12, gz=gz)
  path = tmp_path / ("train-images-idx3-ubyte" + (".gz" if gz else ""))
  contents = path.read_bytes()
  contents = gzip.decompress(contents) if gz else contents
  assert known_files.idx_bytes(sources.read_idx(str(path))) == contents


def test_a_config_naming_another_known_dataset_is_warned(tmp_path, monkeypatch, capsys):
  write_idx_dataset(tmp_path, num_train=40, num_test=12)
  images = sources.read_idx(str(tmp_path / "train-images-idx3-ubyte.gz"))
  digest = hashlib.sha256(known_files.idx_bytes(images)).hexdigest()
  monkeypatch.setitem(known_files.TRAIN_IMAGES_SHA256, digest, "mnist")  # Pretend: MNIST's.
  sources.load(data_config(fashion_mnist, tmp_path), (28, 28, 1), 10)
  out = capsys.readouterr().out
  assert "config.data.name is 'fashion_mnist' but the IDX files in" in out
  assert "are 'mnist'" in out and "trains and tests on mnist" in out
  sources.load(data_config(mnist, tmp_path), (28, 28, 1), 10)  # The right files: silent.
  assert capsys.readouterr().out == ""
  monkeypatch.delitem(known_files.TRAIN_IMAGES_SHA256, digest)  # Unknown files: silent.
  sources.load(data_config(fashion_mnist, tmp_path), (28, 28, 1), 10)
  assert capsys.readouterr().out == ""


@pytest.mark.parametrize("directory,name", [(MNIST_DIR, "mnist"), (FASHION_DIR, "fashion_mnist")])
def test_the_published_files_are_recognised(directory, name):
  path = os.path.join(directory, "train-images-idx3-ubyte.gz")
  if not os.path.exists(path):
    pytest.skip(f"{path} is not on this machine")
  assert known_files.identify(sources.read_idx(path)) == name


def test_the_banner_names_the_configs_dataset():
  from capsjax import datasets

  label = lambda config: datasets.get(config).describe()
  config = fashion_mnist.get_config("smoke")
  assert label(config) == "fashion_mnist"
  config.data.source, config.data.dir = "idx", "/data/fm"
  assert label(config) == "fashion_mnist (IDX files in /data/fm)"
  import multimnist
  assert label(multimnist.get_config("smoke")) == "multimnist (padded by 4 px)"
