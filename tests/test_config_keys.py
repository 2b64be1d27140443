"""capsjax/common/config_keys.py: the keys a config may leave out, read in one place."""

import pathlib
import re

import ml_collections
import pytest

from capsjax.common import config_keys
from capsjax.models import capsnet
from capsjax.runs import runconfig

from tests.helpers import REPO


def test_optional_reads_the_set_value_else_what_leaving_it_out_means():
  data = ml_collections.ConfigDict({"test_limit": 5, "validation_size": None})
  assert config_keys.optional(data, "data.test_limit") == 5
  assert config_keys.optional(data, "data.validation_size") == 0   # None: left out.
  assert config_keys.optional(data, "data.validation_split") == "random"   # Absent.
  assert config_keys.optional(ml_collections.ConfigDict({"validation_split": "first"}),
                              "data.validation_split") == "first"


def test_optional_refuses_a_key_nobody_declared():
  with pytest.raises(KeyError, match="data.no_such_key"):
    config_keys.optional(ml_collections.ConfigDict({"no_such_key": 1}), "data.no_such_key")


def test_a_left_out_key_reaches_the_model_as_its_declared_default():
  """CapsNet's padding: a model config without ``padding`` builds the VALID grid, as one that
  says "VALID"; "SAME" builds another (so the key is read, not ignored)."""
  import mnist  # configs/, on the path in conftest.

  model = ml_collections.ConfigDict(mnist.get_config("smoke").model.to_dict())
  model.image_shape, model.num_classes = (28, 28, 1), 10
  if "padding" in model:
    del model["padding"]
  valid, same = model.copy_and_resolve_references(), model.copy_and_resolve_references()
  valid.padding, same.padding = "VALID", "SAME"
  assert config_keys.OPTIONAL_KEYS["model.padding"] == "VALID"
  assert capsnet.primary_grid(model) == capsnet.primary_grid(valid) == (6, 6)
  assert capsnet.primary_grid(same) != (6, 6)


def test_old_config_json_is_completed_with_the_same_values():
  """A config.json of a CapsNet run from before ``output_scale`` and ``scores`` existed gets
  the values :data:`config_keys.OPTIONAL_KEYS` declares."""
  raw = {"dataset": "smallnorb", "model": {"name": "capsnet", "primary": {},
                                           "class_capsules": {}}, "data": {}}
  added = runconfig.with_added_keys(raw)
  assert added["model"]["primary"]["output_scale"] == (
      config_keys.OPTIONAL_KEYS["model.primary.output_scale"])
  assert added["model"]["class_capsules"]["scores"] == (
      config_keys.OPTIONAL_KEYS["model.class_capsules.scores"])
  assert added["data"]["viewpoint_split"] == config_keys.OPTIONAL_KEYS["data.viewpoint_split"]
  assert added["matmul_precision"] == config_keys.OPTIONAL_KEYS["matmul_precision"] == "default"


def _sources():
  return {path: path.read_text() for path in (pathlib.Path(REPO) / "capsjax").rglob("*.py")}


def test_no_inline_default_for_a_config_key():
  """Defaults of optional keys live in OPTIONAL_KEYS only: no ``config....get("key", value)``
  in capsjax (the reader of a config.json of an earlier version is runconfig)."""
  inline = re.compile(r'config[a-z_.]*\.get\("(?!dataset")[a-z_]+", ')
  found = [f"{path}:{n}" for path, text in _sources().items()
           for n, line in enumerate(text.splitlines(), 1) if inline.search(line)]
  assert not found, found


def test_every_optional_key_is_read():
  """A key of OPTIONAL_KEYS that no code reads with ``optional`` is a stale declaration."""
  text = "\n".join(_sources().values())
  unread = [key for key in config_keys.OPTIONAL_KEYS
            if not re.search(rf'config_keys\.optional\([^"]*"{re.escape(key)}"\)', text)]
  assert not unread, unread
