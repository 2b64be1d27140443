"""The adapter that runs any foolbox attack by name refuses an attack foolbox lacks. (What it
reports, against the attack written out, and foolbox as an oracle for capsjax's own attacks,
on a model that has learned: tests/test_attacks_trained.py.)"""

import pytest

from capsjax.common.errors import UsageError
from helpers import build_evaluators, evaluator_config, write_idx_dataset


@pytest.fixture(scope="module")
def bars_64_40(tmp_path_factory):
  """Generated bar digits (helpers.make_images) as MNIST files: 64 train, 40 test."""
  return write_idx_dataset(tmp_path_factory.mktemp("idx"), num_train=64, num_test=40)


def test_an_unknown_foolbox_attack_is_a_usage_error(bars_64_40):
  settings = {"type": "adversarial", "attacks": ("foolbox:Telepathy",)}
  with pytest.raises(UsageError, match="foolbox has no attack 'Telepathy'"):
    build_evaluators(evaluator_config(bars_64_40, adversarial=settings))
