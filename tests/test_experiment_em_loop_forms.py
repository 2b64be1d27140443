"""experiments/em_loop_forms.py: EM's gradient by the reference loop, the custom VJP and
autodiff of the custom VJP's forward loop agree, and a form that does not is not measured."""

import importlib.util
import json

import jax
import pytest

from helpers import REPO

spec = importlib.util.spec_from_file_location("em_loop_forms",
                                              REPO / "experiments" / "em_loop_forms.py")
forms = importlib.util.module_from_spec(spec)
spec.loader.exec_module(forms)

SIZES = dict(children=8, out_caps=4, positions=3)


def test_the_three_forms_agree_and_each_is_measured(capsys):
  forms.main(["--batches=2", "--calls=1", "--children=8", "--out_caps=4", "--positions=3"])
  line = json.loads(capsys.readouterr().out)
  assert line["votes"] == [2, 8, 4, 3, 16]
  assert line["max_relative_difference"] <= 1e-5
  for name in forms.FORMS:
    assert line[f"{name}_median_s"] > 0 and line[f"{name}_temp_bytes"] is not None


def test_a_form_that_differs_is_not_measured(monkeypatch):
  right = forms.parent_major_autodiff

  def wrong(*args, **kwargs):  # The parents' activations of another beta_a.
    poses, activations = right(*args, **kwargs)
    return poses, jax.nn.sigmoid(jax.scipy.special.logit(activations) + 0.1)

  monkeypatch.setattr(forms, "parent_major_autodiff", wrong)
  with pytest.raises(SystemExit, match="the forms differ by"):
    forms.measure(2, 1, **SIZES)
