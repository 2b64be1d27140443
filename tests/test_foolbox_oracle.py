"""foolbox as an independent oracle for capsjax's jitted FGSM and PGD (same budget, steps,
step size, no random start: the same adversarial success on the same examples), and the
adapter that runs any foolbox attack by name."""

import pytest

from capsjax.common.errors import UsageError
from helpers import write_idx_dataset
from test_adversarial import capsnet_config
from test_evaluators import build, make_config

pytest.importorskip("foolbox")

EPSILONS = (0.0, 0.05, 0.15)


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory):
  return write_idx_dataset(tmp_path_factory.mktemp("idx"), num_train=64, num_test=40)


@pytest.mark.parametrize("model", ["capsnet", "baseline_cnn"])
def test_capsjax_attacks_match_foolbox_on_the_same_examples(idx_dir, model):
  """Through the routing iterations (CapsNet) and through a CNN; accuracy and success per
  epsilon equal, i.e. the same examples fooled (the sets are 40 examples)."""
  steps, step_size = 4, 0.02
  settings = {"type": "adversarial", "epsilons": EPSILONS, "limit": 40, "steps": steps,
              "step_size": step_size, "random_start": False,
              "attacks": ("fgsm", "pgd", "foolbox:FGSM", "foolbox:LinfPGD"),
              "foolbox_kwargs": {"LinfPGD": {"abs_stepsize": step_size, "steps": steps,
                                             "random_start": False}}}
  make = capsnet_config if model == "capsnet" else make_config
  built, params, *_ = build(make(idx_dir, adversarial=settings))
  result = built["adversarial"].run(params)
  for epsilon in EPSILONS:
    for ours, theirs in (("fgsm", "foolbox_FGSM"), ("pgd", "foolbox_LinfPGD")):
      for metric in ("accuracy", "success_rate"):
        assert result[f"{ours}_eps{epsilon:g}_{metric}"] == pytest.approx(
            result[f"{theirs}_eps{epsilon:g}_{metric}"]), (ours, epsilon, metric)
  assert result["pgd_eps0.15_accuracy"] < result["clean_accuracy"] or (
      result["clean_accuracy"] == 0)


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
