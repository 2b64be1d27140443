"""EM routing's gradient three ways, for the choice of one EM loop (issue 71 item 6).

capsjax has two EM loops with the same formulas (:mod:`capsjax.routing.em_arithmetic`):

* ``reference_autodiff``: the reference loop (:func:`capsjax.routing.em.em_routing`,
  child-major, ``jax.checkpoint`` per iteration) differentiated by JAX: ``gradient="autodiff"``,
  what ``"auto"`` runs on GPUs;
* ``analytic``: the custom VJP (:mod:`capsjax.routing.em_gradient`): its own parent-major loop
  (votes shifted by their mean, S2 from the products with V and V^2) and the written-out
  backward pass: ``gradient="analytic"``, what ``"auto"`` runs on CPUs;
* ``parent_major_autodiff``: the custom VJP's forward loop differentiated by JAX, the
  candidate for the one loop both could share.

Folding the two loops into one changes what every GPU EM run executes, so it is chosen on a
GPU's numbers:

    python experiments/em_loop_forms.py [--batches=16,4] [--calls=10]

checks that the three gradients agree (float32) and prints one JSON line per batch: each
form's median seconds of the jitted value and gradient, and its compiled program's temporary
bytes (XLA's memory analysis; null where the backend gives none). The sizes default to
ConvCaps1 of ``configs/em_mnist.py`` (children 3x3x32, 32 types, 5x5 positions, 4x4 poses:
14.7 MB of votes per image). ``experiments/gpu_speed.sh`` runs it in its ``gradients`` stage;
tests/test_experiment_em_loop_forms.py keeps the three equal.
"""

from __future__ import annotations

import argparse
import json
import jax
import jax.numpy as jnp
import numpy as np

from capsjax.perf import rates
from capsjax.routing import em, em_gradient

FORMS = ("reference_autodiff", "analytic", "parent_major_autodiff")


def parent_major_autodiff(votes, activations, beta_u, beta_a, *, settings, normalise):
  """EM routing by the custom VJP's forward loop, without the custom VJP: ``(poses,
  activations)`` as :func:`capsjax.routing.em.em_routing`'s (initial assignments uniform)."""
  batch, children, out_caps, positions, _ = votes.shape
  initial = jnp.full((batch, children, out_caps, positions), 1.0 / out_caps, votes.dtype)
  parent_major = em_gradient._parent_major(jnp.broadcast_to(
      activations, activations.shape[:1] + votes.shape[1:2] + activations.shape[2:]))
  (mean, logit), _ = em_gradient._forward(votes, parent_major, beta_u, beta_a, initial,
                                          settings, normalise)
  return mean, jax.nn.sigmoid(logit)


def routings(settings: dict, normalise) -> dict:
  """``{form: fn(votes, activations, beta_u, beta_a) -> (poses, activations)}``."""
  def by_setting(gradient):
    return lambda *a: tuple(em.em_routing(*a, settings={**settings, "gradient": gradient},
                                          normalise=normalise)[:2])
  return {"reference_autodiff": by_setting("autodiff"), "analytic": by_setting("analytic"),
          "parent_major_autodiff": lambda *a: parent_major_autodiff(
              *a, settings=settings, normalise=normalise)}


def problem(batch: int, children: int, out_caps: int, positions: int, dim: int, seed=0):
  """Votes, activations, betas and the cotangents of the two outputs, float32."""
  rng = np.random.default_rng(seed)
  arrays = dict(votes=rng.normal(size=(batch, children, out_caps, positions, dim)),
                activations=rng.uniform(0.05, 1.0, size=(batch, children, 1, positions)),
                beta_u=rng.normal(size=out_caps), beta_a=0.01 * rng.normal(size=out_caps),
                pose_weights=rng.normal(size=(batch, out_caps, positions, dim)),
                activation_weights=rng.normal(size=(batch, out_caps, positions)))
  return {k: jnp.asarray(v, jnp.float32) for k, v in arrays.items()}


def gradient_programs(x: dict, forms: dict) -> dict:
  """The jitted value and gradient (in votes, activations and both betas) of a weighted sum
  of the outputs, by each form."""
  def program(route):
    def objective(votes, activations, beta_u, beta_a):
      poses, activations_out = route(votes, activations, beta_u, beta_a)
      return (jnp.sum(poses * x["pose_weights"])
              + jnp.sum(activations_out * x["activation_weights"]))
    return jax.jit(jax.value_and_grad(objective, argnums=(0, 1, 2, 3)))
  return {name: program(route) for name, route in forms.items()}


def largest_difference(results: dict) -> float:
  """The largest difference of any form's value or gradient from the reference's, relative
  to the reference's largest magnitude of that array."""
  reference = jax.tree.leaves(results["reference_autodiff"])
  worst = 0.0
  for name, result in results.items():
    for got, want in zip(jax.tree.leaves(result), reference):
      scale = float(np.max(np.abs(want))) or 1.0
      worst = max(worst, float(np.max(np.abs(np.asarray(got) - np.asarray(want)))) / scale)
  return worst


def temp_bytes(compiled) -> int | None:
  analysis = compiled.memory_analysis()
  return None if analysis is None else int(analysis.temp_size_in_bytes)


def measure(batch: int, calls: int, children: int = 288, out_caps: int = 32,
            positions: int = 25, dim: int = 16, tolerance: float = 1e-3) -> dict:
  """The three forms at these sizes: equal values and gradients (within ``tolerance`` of the
  reference's scale, or SystemExit: not measured), then the median seconds of ``calls`` calls
  each (alternating) and each program's temporary bytes."""
  x = problem(batch, children, out_caps, positions, dim)
  settings = dict(em.ROUTER.defaults)
  normalise = lambda log_p: jax.nn.softmax(log_p, axis=2)  # Over each child's parents.
  programs = gradient_programs(x, routings(settings, normalise))
  args = (x["votes"], x["activations"], x["beta_u"], x["beta_a"])
  results = {name: jax.device_get(fn(*args)) for name, fn in programs.items()}
  difference = largest_difference(results)
  if not difference <= tolerance:
    raise SystemExit(f"the forms differ by {difference:.3g} of the reference's scale: "
                     "not measured.")
  seconds = rates.median_seconds(programs, args, calls)
  memory = {name: temp_bytes(fn.lower(*args).compile()) for name, fn in programs.items()}
  return {"measurement": "em_loop_forms", "backend": jax.default_backend(),
          "device": jax.devices()[0].device_kind, "batch": batch,
          "votes": [batch, children, out_caps, positions, dim],
          "iterations": settings["iterations"], "calls": calls,
          "max_relative_difference": difference,
          **{f"{name}_median_s": s for name, s in seconds.items()},
          **{f"{name}_temp_bytes": memory[name] for name in programs}}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batches", default="16,4", help="comma-separated batch sizes")
  parser.add_argument("--calls", type=int, default=10, help="timed calls of each form")
  parser.add_argument("--children", type=int, default=288, help="children (ConvCaps1: 288)")
  parser.add_argument("--out_caps", type=int, default=32, help="parent types (ConvCaps1: 32)")
  parser.add_argument("--positions", type=int, default=25, help="positions (ConvCaps1: 25)")
  args = parser.parse_args(argv)
  for batch in (int(b) for b in args.batches.split(",")):
    print(json.dumps(measure(batch, args.calls, args.children, args.out_caps,
                             args.positions)), flush=True)


if __name__ == "__main__":
  main()
