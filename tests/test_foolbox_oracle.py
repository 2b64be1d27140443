"""The adapter that runs any foolbox attack by name. (foolbox as an oracle for capsjax's own
attacks, on a model that has learned: tests/test_attacks_trained.py.)"""

import pytest

from capsjax.common.errors import UsageError
from helpers import write_idx_dataset
from test_evaluators import build, make_config

pytest.importorskip("foolbox")


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory):
  return write_idx_dataset(tmp_path_factory.mktemp("idx"), num_train=64, num_test=40)


def test_any_foolbox_attack_runs_by_name(idx_dir):
  settings = {"type": "adversarial", "epsilons": (0.5, 2.0), "limit": 8,
              "attacks": ("foolbox:L2CarliniWagnerAttack",),
              "foolbox_kwargs": {"L2CarliniWagnerAttack": {"steps": 5}}}
  built, params, *_ = build(make_config(idx_dir, adversarial=settings))
  result = built["adversarial"].run(params)
  assert 0 <= result["foolbox_L2CarliniWagnerAttack_eps2_accuracy"] <= 1
  assert result["accuracy"] == result["foolbox_L2CarliniWagnerAttack_eps2_accuracy"]


def test_an_unknown_foolbox_attack_is_a_usage_error(idx_dir):
  settings = {"type": "adversarial", "attacks": ("foolbox:Telepathy",)}
  with pytest.raises(UsageError, match="foolbox has no attack 'Telepathy'"):
    build(make_config(idx_dir, adversarial=settings))
