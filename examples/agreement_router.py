"""A router of one's own, named by import path: one pass of agreement with a temperature.

    python -m capsjax.main --config=examples/config.py:router --workdir=/tmp/ex_router
    # or on any config, without touching capsjax:
    python -m capsjax.main --config=configs/mnist.py \
        --config.model.routing.name=examples/agreement_router.py:ROUTER --workdir=/tmp/run

A router is a pure function from votes to parents plus its settings and their defaults
(:class:`capsjax.routing.Router`; the interface is in ``capsjax/routing/__init__.py``). This
one couples each child to the parents its vote agrees with, in a single pass::

    v_j^0 = squash(mean_i u_hat_{j|i})                  # the uniform-coupling parents
    c_ij  = softmax_j(<u_hat_{j|i}, v_j^0> / temperature)
    v_j   = squash(sum_i c_ij u_hat_{j|i})

i.e. dynamic routing's second iteration (Procedure 1, r = 2) with the logits scaled by
``1 / temperature``: a large temperature gives uniform coupling, a small one winner-take-all.
Its settings, ``config.model.routing.temperature`` and ``squash_epsilon``, are checked here and
recorded in the run's config.json like a registered router's.
"""

import jax
import jax.numpy as jnp

from capsjax.common.errors import UsageError
from capsjax.routing import Router, RoutingResult, coupled_parents, squash

SETTINGS = {"temperature": 1.0, "squash_epsilon": 0.0}


def check(settings: dict) -> None:
  if not settings["temperature"] > 0:
    raise UsageError(f"config.model.routing.temperature must be > 0, got "
                     f"{settings['temperature']!r}.")


def route(votes, *, inputs=None, activations=None, params=None, rng=None, settings,
          train=False, diagnostics=False) -> RoutingResult:
  """``votes`` ``(batch, in_caps, out_caps, out_dim)`` -> parents ``(batch, out_caps,
  out_dim)``; diagnostics as :func:`capsjax.routing.core.coupled_parents` gives them."""
  del inputs, activations, rng, train
  uniform = squash(jnp.mean(votes, axis=1), epsilon=settings["squash_epsilon"])
  agreement = jnp.einsum("bijd,bjd->bij", votes, uniform)
  coupling = jax.nn.softmax(agreement / settings["temperature"], axis=2)
  return coupled_parents(votes, coupling, bias=(params or {}).get("bias"),
                         squash_epsilon=settings["squash_epsilon"], diagnostics=diagnostics)


ROUTER = Router(name="agreement", settings=SETTINGS, route=route, check=check,
                uses_parent_bias=True)
