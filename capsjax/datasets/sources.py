"""Image/label data read once into host memory: IDX files or tensorflow-datasets.

Two sources (``config.data.source``):
  * ``"tfds"``: any tensorflow-datasets name (``config.data.name``). Online it downloads;
    offline, ``config.data.dir`` may hold the original archive files, which tfds then uses as
    its manual dir (it checks their checksums).
  * ``"idx"``: a folder of MNIST-format IDX files (:data:`IDX_FILES`, each raw or ``.gz``),
    read with NumPy alone.

:func:`load` validates what it read against the config and holds out the validation split;
everything here is host-side NumPy.
"""
from __future__ import annotations

import contextlib
import gzip
import logging
import os
import socket
import types
import urllib.parse

import ml_collections
import numpy as np

from capsjax.config import settings
from capsjax.common.errors import UsageError
from capsjax.config.settings import NON_NEGATIVE, Setting, one_of
from capsjax.datasets import Split, known_files, stream_order
from capsjax.runs.reporting import log

IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
_IDX_UBYTE = 0x08

# ``config.data`` of every dataset read through :func:`load`.
SETTINGS = {
    "data.source": Setting(kind=str, meaning="\"tfds\": a tensorflow-datasets name; \"idx\": "
                           "IDX files.", check=one_of("tfds", "idx")),
    "data.name": Setting(kind=str, meaning="The tfds name (ignored by \"idx\")."),
    "data.dir": Setting(None, "tfds: the manual dir of the original archives (offline); idx: "
                        "the IDX folder.", kind=str | None, neutral=True),
    "data.tfds_data_dir": Setting(None, "Where tfds keeps prepared data.", kind=str | None,
                                  neutral=True),
    "data.train_limit": Setting(0, "Train on the first N training examples only (0: all).",
                                check=NON_NEGATIVE),
    "data.test_limit": Setting(0, "Evaluate a fixed random sample of N examples (0: all).",
                               check=NON_NEGATIVE),
    "data.validation_size": Setting(0, "Examples held out of train for validation (0: none).",
                                    check=NON_NEGATIVE),
    "data.validation_split": Setting("random", "Drawn with the seed; \"first\": the first "
                                     "validation_size (the official code's).",
                                     check=one_of("random", "first")),
}


def load(config: ml_collections.ConfigDict, image_shape, num_classes: int, seed: int = 0,
         shape_source: str = "config.model.image_shape", image_keys=("image",),
         label_key: str = "label", idx_ok: bool = True, partition=None) -> dict[str, Split]:
  """Reads ``config`` (``config.data``), validates it and splits off validation.

  With tfds, ``image_keys`` name the image features (several: stacked as channels, e.g.
  smallNORB's two views) and ``label_key`` the label feature. ``idx_ok``: whether the
  dataset can also be read from IDX files (the offline advice then mentions them).

  ``partition`` (tfds only): ``(feature_keys, familiar, novel_split)``; ``familiar(features)``
  maps the named features of a split (``{key: (n,) int array}``) to a boolean mask. Training
  (and validation) then keep the familiar examples only, the test split keeps its familiar
  ones, and its others become the split ``novel_split`` (smallNORB's novel viewpoints), before
  ``train_limit`` and ``test_limit`` (which limits both test splits).

  ``image_shape`` is the shape the files must have; ``shape_source`` names the setting it comes
  from, for the error message.

  Returns:
    ``{"train", "validation", "test"}`` splits with ``images`` uint8 ``(n, *image_shape)`` and
    ``labels`` int32 ``(n,)``; ``validation`` holds ``config.validation_size`` examples drawn
    from train with ``seed`` (``config.validation_split="random"``, the default) or the first
    ones (``"first"``, as the official CapsNet code's ``--validate``).

  Raises:
    UsageError: with the path or config key at fault and what to do.
  """
  check_file_order(config)
  config = values(config)
  if partition and config.source != "tfds":
    raise UsageError("A split by viewpoint reads tensorflow-datasets' features; set "
                     "config.data.source='tfds'.")
  if config.source == "idx":
    arrays = _load_idx(config.dir)
    warning = known_files.mismatch_warning(config.name, arrays["train"][0][..., 0], config.dir)
    if warning:
      log(warning)
  elif config.source == "tfds":
    arrays = _load_tfds(config.name, config.dir, config.tfds_data_dir, tuple(image_keys),
                        label_key, idx_ok, tuple(partition[0]) if partition else ())
  else:
    raise UsageError(f"config.data.source must be 'tfds' or 'idx', got {config.source!r}.")
  where = config.dir if config.source == "idx" else f"tfds dataset {config.name!r}"
  sizes = {}  # Each split's size in the source, before any selection.
  for split in ("train", "test"):
    images, labels, features = arrays[split]
    if images.ndim == 3:  # IDX and tfds give grey images without a channel axis.
      images = images[..., None]
    check_split(split, images, labels, tuple(image_shape), num_classes, where, shape_source)
    ids, sizes[split] = np.arange(len(labels)), len(labels)
    if partition:
      familiar = np.asarray(partition[1](features), bool)
      if split == "test":  # Its other examples: the split partition[2] names.
        arrays[partition[2]] = (images[~familiar], labels[~familiar], ids[~familiar])
        sizes[partition[2]] = len(labels)
      images, labels, ids = images[familiar], labels[familiar], ids[familiar]
    arrays[split] = (images, labels, ids)
  splits = {name: Split({"images": images, "labels": labels}, ids=ids,
                        source_size=sizes[name]) for name, (images, labels, ids) in arrays.items()}
  if config.train_limit:  # The first N: a smaller training set.
    splits["train"] = splits["train"].first(config.train_limit)
  for name in splits:
    if name != "train" and config.test_limit:  # A fair sample: see Split.sample.
      splits[name] = splits[name].sample(config.test_limit)

  train = splits.pop("train")
  n_val = int(config.validation_size)
  if n_val < 0 or n_val >= len(train):
    raise UsageError(f"config.data.validation_size={n_val} must be in [0, "
                     f"{len(train)}) for {len(train)} training examples.")
  # "first": the official code's --validate (the first 10,000); "random": drawn with the seed.
  order = (np.arange(len(train)) if config.validation_split == "first"
           else np.random.default_rng(seed).permutation(len(train)))
  return {"train": train.take(np.sort(order[n_val:])),
          "validation": train.take(np.sort(order[:n_val])), **splits}


def values(config) -> types.SimpleNamespace:
  """The settings of :data:`SETTINGS` in ``config`` (``config.data``, resolved or as a config
  file writes it: a researcher's dataset without ``SETTINGS`` hands it over as given), each
  checked and its default filled in (:func:`capsjax.config.settings.read`)."""
  table = {key.split(".", 1)[1]: setting for key, setting in SETTINGS.items()}
  return types.SimpleNamespace(**settings.read(config, table, "config.data"))


def check_file_order(config: ml_collections.ConfigDict) -> None:
  """Refuses the settings that assume the original files' order of examples when the data come
  from tensorflow-datasets, whose writer orders examples by a hash of their key:
  ``data.validation_split="first"`` with a validation split, and ``data.order="stream"``."""
  order = settings.read(config, {"order": stream_order.SETTINGS["data.order"]},
                        "config.data")["order"]
  config = values(config)
  if config.source != "tfds":
    return
  if int(config.validation_size) and config.validation_split == "first":
    setting = (f"config.data.validation_split='first' (with validation_size="
               f"{int(config.validation_size)}) holds out the first training examples of the "
               "original files, as the official code's --validate")
  elif order == "stream":
    setting = ("config.data.order='stream' reads the training examples in the original "
               "files' order, as the official code")
  else:
    return
  other = (", or hold out a random split: --config.data.validation_split=random"
           if "validation_split" in setting else "")
  raise UsageError(f"{setting}; tensorflow-datasets ({config.name!r}) reads them in another "
                   "order (its writer orders examples by a hash of their key), so these would "
                   "be other examples. Read the original files: --config.data.source=idx "
                   "--config.data.dir=/path/to/mnist (a folder with the four IDX files)"
                   f"{other}.")


def check_split(split: str, images: np.ndarray, labels: np.ndarray, image_shape: tuple,
                num_classes: int, where: str,
                shape_source: str = "config.model.image_shape") -> None:
  """Raises UsageError, naming ``where``, if images or labels do not fit the config."""
  if images.shape[1:] != image_shape:
    raise UsageError(f"{where}: {split} images have shape {images.shape[1:]}, but "
                     f"{shape_source} is {image_shape}. Use matching data or change that "
                     "setting.")
  if len(images) != len(labels):
    raise UsageError(f"{where}: {len(images)} {split} images but {len(labels)} labels; "
                     "the files do not belong together.")
  if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
    raise UsageError(f"{where}: {split} labels lie in [{labels.min()}, {labels.max()}], "
                     f"outside [0, {num_classes}) of config.model.num_classes={num_classes}.")


def read_idx(path: str) -> np.ndarray:
  """Reads one IDX file (raw or gzip) of unsigned bytes into an array."""
  try:
    with open(path, "rb") as f:
      raw = f.read()
    if raw[:2] == b"\x1f\x8b":
      raw = gzip.decompress(raw)
  except (OSError, EOFError) as e:
    raise UsageError(f"Cannot read IDX file {path}: {e}. Replace it with an intact copy.") from e
  if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != _IDX_UBYTE or raw[3] == 0:
    raise UsageError(f"{path} is not an IDX file of unsigned bytes (bad magic number "
                     f"{raw[:4].hex() or 'empty'}, expected 0000 08 0N). Replace it with the "
                     "original MNIST-format file.")
  ndim = raw[3]
  header = 4 + 4 * ndim
  shape = tuple(int.from_bytes(raw[4 + 4 * k:8 + 4 * k], "big") for k in range(ndim))
  if len(raw) != header + int(np.prod(shape)):
    raise UsageError(f"{path}: the header says shape {shape} ({int(np.prod(shape))} bytes) but "
                     f"the file holds {len(raw) - header} bytes of data; it is truncated or "
                     "corrupt. Replace it with an intact copy.")
  return np.frombuffer(raw, np.uint8, offset=header).reshape(shape)


def _find_idx(directory: str, stem: str) -> str:
  for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"),
               stem.replace("-idx", ".idx") + ".gz"):
    path = os.path.join(directory, name)
    if os.path.exists(path):
      return path
  raise UsageError(f"{directory} has no {stem}[.gz]. An idx data dir needs the four MNIST-format "
                   f"files {', '.join(IDX_FILES.values())} (raw or .gz).")


def _load_idx(directory: str | None) -> dict:
  if not directory:
    raise UsageError("config.data.source='idx' needs --config.data.dir=PATH, a folder with "
                     "MNIST-format IDX files.")
  if not os.path.isdir(directory):
    raise UsageError(f"config.data.dir={directory!r} does not exist or is not a folder. "
                     "Point it at a folder with MNIST-format IDX files.")
  arrays = {key: read_idx(_find_idx(directory, stem)) for key, stem in IDX_FILES.items()}
  for key in ("train_images", "test_images", "train_labels", "test_labels"):
    ndim, what = (3, "images of shape (n, h, w)") if "image" in key else (1, "labels of shape (n,)")
    if arrays[key].ndim != ndim:
      raise UsageError(f"{_find_idx(directory, IDX_FILES[key])}: expected {what}, got "
                       f"{arrays[key].shape}.")
  return {split: (arrays[f"{split}_images"][..., None], arrays[f"{split}_labels"].astype(np.int32),
                  {}) for split in ("train", "test")}


def offline_hint(builder, idx_ok: bool) -> str:
  """What an offline user can do for this tfds dataset: its manual-dir files, prepared data,
  and (for MNIST-format datasets) IDX files."""
  names = manual_files(builder)
  hint = ("Offline, put tfds's files for it" + (f" ({', '.join(names)})" if names else "")
          + " in a folder and pass --config.data.dir=FOLDER, or point "
          "--config.data.tfds_data_dir at a folder where tfds already prepared it")
  return hint + (", or use --config.data.source=idx --config.data.dir=FOLDER with MNIST-format "
                 "IDX files." if idx_ok else ".")


def manual_files(builder) -> list[str]:
  """The file names tfds looks for in a manual dir: its download URLs' last parts."""
  return sorted(os.path.basename(urllib.parse.urlsplit(u).path) for u in (builder.url_infos or ()))

PROXY_VARIABLES = ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy",
                   "ALL_PROXY")


def check_reachable(urls: list[str], name: str, timeout: float = 5.0, hint: str = "") -> None:
  """Raises UsageError at once if a host of ``urls`` cannot be reached (name lookup and TCP
  connect within ``timeout`` s). Behind a proxy (``*_proxy`` variables) nothing is checked:
  only the proxy could tell."""
  if any(os.environ.get(v) for v in PROXY_VARIABLES):
    return
  hosts = sorted({(u.hostname, u.port or (443 if u.scheme == "https" else 80))
                  for u in map(urllib.parse.urlsplit, urls) if u.hostname})
  for host, port in hosts:
    try:
      socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
      raise UsageError(f"tensorflow-datasets cannot download {name!r}: {host} is not reachable "
                       f"({type(e).__name__}: {e}). {hint}") from e


@contextlib.contextmanager
def _quiet_absl():
  """Hides absl's (tfds's) warnings for the block: ``is_prepared`` warns "Variant folder ...
  has no dataset_info.json" for a dataset not yet prepared, which says nothing to a user whose
  run then prepares it or stops with its own clear error."""
  logger = logging.getLogger("absl")
  level = logger.level
  logger.setLevel(logging.ERROR)
  try:
    yield
  finally:
    logger.setLevel(level)


def _load_tfds(name: str, manual_dir: str | None, data_dir: str | None,
               image_keys=("image",), label_key: str = "label", idx_ok: bool = True,
               feature_keys=()) -> dict:
  """``{split: (images, labels, {feature: (n,) int32})}`` for train and test."""
  import tensorflow_datasets as tfds  # Heavy (TensorFlow); only for this source.

  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise UsageError(f"Unknown tensorflow-datasets name config.data.name={name!r}. "
                     "See https://www.tensorflow.org/datasets/catalog, or use "
                     "--config.data.source=idx for IDX files.") from e
  download_config = None
  hint = offline_hint(builder, idx_ok)
  with _quiet_absl():
    needed = not builder.is_prepared() and not _tfds_mocked(builder)
  if manual_dir:
    if not os.path.isdir(manual_dir):
      raise UsageError(f"config.data.dir={manual_dir!r} does not exist or is not a folder; "
                       "for tfds it must hold the original archive files.")
    missing = [f for f in manual_files(builder) if not os.path.exists(os.path.join(manual_dir, f))]
    if needed and missing:  # Else tfds would try to download them, retrying for minutes.
      raise UsageError(f"config.data.dir={manual_dir!r} lacks the files tfds needs for {name!r}: "
                       f"{', '.join(missing)}. Put the original files there (tfds checks their "
                       f"checksums)" + (", or use --config.data.source=idx for IDX files." if
                                       idx_ok else "."))
    download_config = tfds.download.DownloadConfig(manual_dir=manual_dir)
  elif needed:
    # Offline, tfds retries each download with back-off for minutes before it gives up.
    check_reachable(list(builder.url_infos or ()), name, hint=hint)
  try:
    builder.download_and_prepare(download_config=download_config)
  except Exception as e:  # tfds raises many types; all mean "could not prepare".
    raise UsageError(f"tensorflow-datasets could not prepare {name!r} "
                     f"(manual dir {manual_dir!r}): {type(e).__name__}: {e}. {hint}") from e
  features = builder.info.features
  missing = [k for k in (*image_keys, label_key, *feature_keys) if k not in features]
  if missing:
    raise UsageError(f"tfds dataset {name!r} has no feature {missing[0]!r} (it has "
                     f"{sorted(features.keys())}).")
  splits = {}
  for split in ("train", "test"):
    # In batches: batch_size=-1 aborts the process under tfds.testing.mock_data.
    parts = list(tfds.as_numpy(builder.as_dataset(split=split, batch_size=4096)))
    images = [np.concatenate([np.asarray(p[k], np.uint8) for p in parts]) for k in image_keys]
    ints = lambda key: np.concatenate([np.asarray(p[key], np.int32) for p in parts])
    splits[split] = (images[0] if len(images) == 1 else np.concatenate(images, axis=-1),
                     ints(label_key), {key: ints(key) for key in feature_keys})
  return splits


def _tfds_mocked(builder) -> bool:
  """Whether ``tfds.testing.mock_data`` is active (it makes up data; nothing is downloaded)."""
  method = getattr(type(builder), "download_and_prepare", None)
  return getattr(method, "__module__", "").startswith("tensorflow_datasets.testing")
