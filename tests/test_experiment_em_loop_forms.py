"""experiments/em_loop_forms.py: the two forms EM's router replaced (the custom VJP and the
child-major reference loop, until 2026-11-29 the settings ``gradient="analytic"`` and
``"autodiff"``) give the router's value and gradients, in float64 to 1e-10 for the class
layer's softmax and each convolutional normalisation (the custom VJP's written-out backward
pass with every change of settings), so that what the experiment times are three forms of one
gradient; it measures the three, and a form that differs is not measured."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from capsjax.models import receptive_fields as fields
from capsjax.routing import em
from capsjax.config.runconfig import import_config_file
from helpers import REPO

forms = import_config_file(REPO / "experiments" / "em_loop_forms.py")

SIZES = dict(children=8, out_caps=4, positions=3)
CODE = dict(em.ROUTER.defaults)


def conv_case(mode):
  i, k, s, oh, ow = 2, 3, 2, 2, 2   # in_types, kernel, stride, output grid
  normalise = fields.conv_normaliser(mode, i, k, s, oh, ow, 1e-7)
  shape = (2, i * k * k, 3, oh * ow, 16)
  initial = normalise(jnp.zeros(shape[:4], jnp.float64)) if mode == "child" else None
  return shape, normalise, initial


CASES = {
    "class layer": lambda: ((2, 7, 5, 1, 16), lambda log_p: jax.nn.softmax(log_p, axis=2),
                            None),
    "code": lambda: conv_case("code"),
    "child": lambda: conv_case("child"),
    "patch": lambda: conv_case("patch"),
}
CHANGES = {
    "defaults": {},
    "one iteration": {"iterations": 1},
    "five iterations, stop-gradient": {"iterations": 5, "stop_gradient": True},
    "no damping, sharp": {"mean_damping": 0.0, "inverse_temperature": 1.0},
}


# Each layer's normalisation once and each change of settings once (a covering design: every
# compilation in float64 costs test time); the custom VJP, whose backward pass is written out,
# in every pairing, the reference loop (autodiff, like the router) in two.
PAIRINGS = [("class layer", "defaults"), ("code", "one iteration"),
            ("child", "five iterations, stop-gradient"), ("patch", "no damping, sharp")]
REFERENCE_LOOP_CHANGES = ("defaults", "five iterations, stop-gradient")


@pytest.mark.parametrize("case,changes", PAIRINGS)
def test_the_removed_forms_give_the_routers_gradient_in_float64(case, changes):
  names = ("custom_vjp",) + (("reference_loop",) if changes in REFERENCE_LOOP_CHANGES else ())
  with jax.enable_x64(True):
    shape, normalise, initial = CASES[case]()
    x = forms.problem(*shape, dtype=jnp.float64)
    routes = forms.routings(dict(CODE, **CHANGES[changes]), normalise, initial)
    programs = forms.gradient_programs(x, {name: routes[name] for name in ("router", *names)})
    results = {name: fn(x["votes"], x["activations"], x["beta_u"], x["beta_a"])
               for name, fn in programs.items()}
    (value, grads) = results["router"]
    assert value.dtype == jnp.float64
    for name in names:
      got_value, got = results[name]
      np.testing.assert_allclose(got_value, value, rtol=1e-10, err_msg=name)
      for arg, g, w in zip(("votes", "activations", "beta_u", "beta_a"), got, grads):
        scale = float(jnp.max(jnp.abs(w)))
        assert scale > 0, f"the gradient in {arg} is zero: the comparison would be vacuous"
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10 * scale,
                                   err_msg=f"{name}: gradient in {arg}")


def test_the_three_forms_agree_and_each_is_measured(capsys):
  forms.main(["--batches=2", "--calls=1", "--children=8", "--out_caps=4", "--positions=3"])
  line = json.loads(capsys.readouterr().out)
  assert line["votes"] == [2, 8, 4, 3, 16]
  assert line["max_relative_difference"] <= 1e-5
  for name in forms.FORMS:
    assert line[f"{name}_median_s"] > 0 and line[f"{name}_temp_bytes"] is not None


def test_a_form_that_differs_is_not_measured(monkeypatch):
  right = forms.custom_vjp

  def wrong(*args, **kwargs):  # The parents' activations of another beta_a.
    poses, activations = right(*args, **kwargs)
    return poses, jax.nn.sigmoid(jax.scipy.special.logit(activations) + 0.1)

  monkeypatch.setattr(forms, "custom_vjp", wrong)
  with pytest.raises(SystemExit, match="the forms differ by"):
    forms.measure(2, 1, **SIZES)
