"""Dynamic routing (router ``"dynamic"``): Procedure 1 of Sabour, Frosst & Hinton (2017),
"Dynamic Routing Between Capsules", with the switches on which public implementations disagree,
each defaulting to the paper's behaviour.

Shapes used throughout: ``votes``, the prediction vectors u_hat_{j|i},
``(batch, in_caps, out_caps, out_dim)``; ``logits`` (the routing logits b_ij) and ``coupling``
(the coupling coefficients c_ij), ``(batch, in_caps, out_caps)``; the output capsules v_j,
``(batch, out_caps, out_dim)``. The votes are the only large tensor: nothing here forms an
array of size batch x in_caps x out_caps x out_dim x in_dim.

Procedure 1 itself (:func:`procedure_1`) is written once, on parent-major votes
``(batch, out_caps, out_dim, in_caps)`` (logits and coupling ``(batch, out_caps, in_caps)``): both
products with the votes are then batched matrix-vector products over ``(batch, out_caps)`` with no
transpose of the votes between iterations (on XLA:CPU the faster layout). :func:`dynamic_routing`
calls it, differentiated by JAX; so does the written-out backward pass that
``experiments/dynamic_gradient.py`` measures against it (its custom VJP runs :func:`procedure_1`
forward and uses :func:`preactivation` and :func:`agreement` as each other's transposes).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from capsjax.config.settings import Setting, one_of
from capsjax.routing.core import safe_norm, squash
from capsjax.routing.dynamic_trace import RoutingTrace, routing_diagnostics_per_example
from capsjax.routing.router import SQUASH_EPSILON, Router, RoutingResult, iterations_setting

SOFTMAX_AXES = ("output", "input")

def coupling_coefficients(logits: jax.Array, softmax_axis: str = "output",
                          leaky: bool = False) -> jax.Array:
  """Coupling coefficients c_ij from routing logits b_ij (Procedure 1, line 4).

  Args:
    logits: ``(batch, in_caps, out_caps)``.
    softmax_axis: ``"output"`` normalises over the parents j of each child i,
      as in the paper; ``"input"`` normalises over the children i of each
      parent j, as several public implementations do.
    leaky: add one extra logit fixed at 0 to the softmax and drop its share, as the official code's
      ``_leaky_routing`` does; a child can then send part of its vote to no parent ("orphan" class),
      so the coefficients sum to less than 1.

  Returns:
    ``(batch, in_caps, out_caps)``.
  """
  return _softmax(logits, _softmax_axis_index(softmax_axis), leaky)


def _softmax(logits, axis, leaky):
  if not leaky:
    return jax.nn.softmax(logits, axis=axis)
  leak_shape = list(logits.shape)
  leak_shape[axis] = 1
  padded = jnp.concatenate([logits, jnp.zeros(leak_shape, logits.dtype)], axis=axis)
  return jax.lax.slice_in_dim(jax.nn.softmax(padded, axis=axis), 0, logits.shape[axis], axis=axis)


def _softmax_axis_index(softmax_axis: str) -> int:
  """The axis of ``softmax_axis`` in a ``(batch, in_caps, out_caps)`` array."""
  if softmax_axis not in SOFTMAX_AXES:
    raise ValueError(f"softmax_axis must be one of {SOFTMAX_AXES}, got {softmax_axis!r}.")
  return 2 if softmax_axis == "output" else 1


# --- Procedure 1 on parent-major votes ---------------------------------------------------

def preactivation(votes: jax.Array, coupling: jax.Array) -> jax.Array:
  """Eq. 2, ``s_j = sum_i c_ij u_hat_{j|i}``: ``(b, j, d, i)``, ``(b, j, i)`` -> ``(b, j, d)``."""
  return jnp.einsum("bjdi,bji->bjd", votes, coupling)


def agreement(votes: jax.Array, parents: jax.Array) -> jax.Array:
  """Procedure 1, line 7, ``u_hat_{j|i} . v_j``: ``(b, j, d, i)``, ``(b, j, d)`` ->
  ``(b, j, i)``."""
  return jnp.einsum("bjdi,bjd->bji", votes, parents)


def uniform_coupling(votes: jax.Array, uniform: float) -> jax.Array:
  """The first iteration's coupling (``b = 0``), ``(b, j, i)`` all ``uniform``: written as a
  constant, XLA need not constant-fold a softmax over a whole array (seconds)."""
  return jnp.full(votes.shape[:2] + votes.shape[3:], uniform, votes.dtype)


def procedure_1(votes: jax.Array, *, iterations: int,
                normalise: Callable[[jax.Array], jax.Array], uniform: float,
                bias: jax.Array | None = None, squash_epsilon: float = 0.0,
                routed_votes: jax.Array | None = None,
                observe: Callable[..., Any] | None = None, observed: Any = None,
                python_loop: bool = False):
  """Routing-by-agreement (Procedure 1)::

      b <- 0
      for t = 0 .. r-1:
        c_t <- normalise(b)                      # Line 4 (uniform for t = 0)
        s_t <- sum_i c_t u_hat (+ bias)          # Line 5, Eq. 2
        v_t <- squash(s_t)                       # Line 6, Eq. 1
        b   <- b + u_hat . v_t                   # Line 7 (t < r-1)

  Args:
    votes: u_hat, parent-major ``(batch, out_caps, out_dim, in_caps)``.
    iterations: r >= 1, a Python int (static bounds: the loop stays reverse-differentiable).
    normalise: logits ``(batch, out_caps, in_caps)`` -> coupling (the softmax over the chosen
      axis, leaky or not).
    uniform: the first iteration's coupling, ``normalise`` of zeros.
    bias: ``(out_caps, out_dim)`` added to every ``s_t``, or None.
    squash_epsilon: see :func:`capsjax.routing.core.squash`.
    routed_votes: the votes that the iterations before the last route with (default
      ``votes``); ``stop_gradient(votes)`` gives the switch ``stop_gradient``: only the last
      ``s_t`` sees the votes themselves.
    observe: ``observe(observed, t, b_t, c_t, s_t) -> observed``, called at each iteration
      with the logits it started from (zeros for t = 0), its coupling and ``s_t`` (a trace
      for diagnostics, or the residuals of a backward pass); ``t`` may be traced.
    observed: what ``observe`` starts from (arrays of fixed shapes, unless ``python_loop``).
    python_loop: run the iterations as a Python loop instead of ``fori_loop``, so that ``observe``
      sees each ``t`` as an int and may keep what it is given in a list (the residuals of
      experiments/dynamic_gradient.py's backward pass: no arrays to write them into).

  Returns:
    The parents v_{r-1}, ``(batch, out_caps, out_dim)``, and ``observed``.
  """
  routed_votes = votes if routed_votes is None else routed_votes

  def s_of(coupling, votes_):
    s = preactivation(votes_, coupling)
    return s if bias is None else s + bias

  def note(observed, t, logits, coupling, s):
    return observed if observe is None else observe(observed, t, logits, coupling, s)

  def iteration(t, observed, logits, coupling):
    """Lines 5-7: the next logits."""
    s = s_of(coupling, routed_votes)
    observed = note(observed, t, logits, coupling, s)
    return logits + agreement(routed_votes, squash(s, epsilon=squash_epsilon)), observed

  logits = jnp.zeros(votes.shape[:2] + votes.shape[3:], votes.dtype)
  coupling = uniform_coupling(votes, uniform)
  if iterations > 1:
    logits, observed = iteration(0, observed, logits, coupling)

  def intermediate_iteration(t, carry):
    logits, observed = carry
    return iteration(t, observed, logits, normalise(logits))

  # Unrolled: a rolled loop stacks per-iteration residuals for the gradient, which XLA:CPU
  # ran slower; r is small.
  if python_loop:
    for t in range(1, iterations - 1):
      logits, observed = intermediate_iteration(t, (logits, observed))
  else:
    logits, observed = jax.lax.fori_loop(1, iterations - 1, intermediate_iteration,
                                         (logits, observed), unroll=True)
  if iterations > 1:
    coupling = normalise(logits)
  s = s_of(coupling, votes)
  observed = note(observed, iterations - 1, logits, coupling, s)
  return squash(s, epsilon=squash_epsilon), observed


def dynamic_routing(votes: jax.Array,
                    num_iterations: int,
                    *,
                    softmax_axis: str = "output",
                    stop_gradient: bool = False,
                    leaky: bool = False,
                    bias: jax.Array | None = None,
                    squash_epsilon: float = 0.0,
                    return_trace: bool = False):
  """Routing-by-agreement, Procedure 1 of the paper (the loop, line by line:
  :func:`procedure_1`), on child-major votes; the coupling c_i = softmax(b_i) over the parents j
  (``softmax_axis``).

  Args:
    votes: u_hat_{j|i}, ``(batch, in_caps, out_caps, out_dim)``.
    num_iterations: r >= 1, a Python int (the loop bounds must be static for reverse-mode
      differentiation).
    softmax_axis: ``"output"`` (paper) or ``"input"``; see :func:`coupling_coefficients`.
    stop_gradient: if True, gradients do not flow through the votes of the intermediate
      iterations: logits are built from ``stop_gradient(votes)`` and only the final ``s_j`` sees
      the votes themselves. The outputs are unchanged. The paper does not stop gradients
      (default False).
    leaky: leaky routing, an extra zero logit (official code); default False.
    bias: optional ``(out_caps, out_dim)`` added to s_j (the official code has one, the paper
      does not); None for no bias.
    squash_epsilon: see :func:`squash`.
    return_trace: also return a :class:`RoutingTrace`.

  Returns:
    The output capsules v_j, ``(batch, out_caps, out_dim)``; with ``return_trace``, the pair
    ``(v, trace)``.
  """
  if not isinstance(num_iterations, int) or isinstance(num_iterations, bool):
    raise TypeError(f"num_iterations must be a Python int, got {num_iterations!r}.")
  if num_iterations < 1:
    raise ValueError(f"num_iterations must be >= 1, got {num_iterations}.")
  if votes.ndim != 4:
    raise ValueError("votes must have shape (batch, in_caps, out_caps, out_dim), "
                     f"got shape {votes.shape}.")
  # Inside, everything is parent-major (:func:`procedure_1`); XLA folds
  # the one transpose here into the einsum that made the votes.
  _softmax_axis_index(softmax_axis)  # Validates early with a clear message.
  softmax_index = {"output": 1, "input": 2}[softmax_axis]
  votes = jnp.transpose(votes, (0, 2, 3, 1))
  batch, out_caps, _, in_caps = votes.shape
  uniform = 1.0 / ((out_caps if softmax_axis == "output" else in_caps) + int(leaky))
  normalise = lambda logits: _softmax(logits, softmax_index, leaky)
  child_major = lambda x: jnp.transpose(x, (0, 2, 1))

  def record(trace, r, logits, coupling, preactivation):
    return RoutingTrace(
        logits=trace.logits.at[r].set(child_major(logits)),
        coupling=trace.coupling.at[r].set(child_major(coupling)),
        preactivation_norm=trace.preactivation_norm.at[r].set(safe_norm(preactivation)))

  trace = None
  if return_trace:
    empty = jnp.zeros((num_iterations, batch, in_caps, out_caps), votes.dtype)
    norms = jnp.zeros((num_iterations, batch, out_caps), votes.dtype)
    trace = RoutingTrace(logits=empty, coupling=empty, preactivation_norm=norms)
  outputs, trace = procedure_1(
      votes, iterations=num_iterations, normalise=normalise, uniform=uniform, bias=bias,
      squash_epsilon=squash_epsilon, observe=record if return_trace else None, observed=trace,
      routed_votes=jax.lax.stop_gradient(votes) if stop_gradient else votes)
  if not return_trace:
    return outputs
  # With one iteration the whole trace is a constant (b = 0, uniform c); the barrier keeps
  # XLA from constant-folding the diagnostics over it at compile time (seconds per batch).
  return outputs, jax.lax.optimization_barrier(trace)


# ``config.model.routing`` of dynamic routing: the paper's values (Procedure 1).
SETTINGS = {
    "iterations": iterations_setting(3, "r, the routing iterations (paper: 3 for MNIST)."),
    "softmax_axis": Setting("output", "The coupling's softmax over parents j (\"output\", the "
                            "paper's) or children i (\"input\").", check=one_of(*SOFTMAX_AXES)),
    "stop_gradient": Setting(False, "True: no gradient through the intermediate iterations "
                             "(the paper has none)."),
    "leaky": Setting(False, "The official code's extra zero logit (leaky routing); the "
                     "paper: none."),
    "squash_epsilon": SQUASH_EPSILON,
}


def route(votes, *, inputs=None, activations=None, params=None, rng=None, settings,
          train=False, diagnostics=False) -> RoutingResult:
  """The router interface (:mod:`capsjax.routing`) over :func:`dynamic_routing`.

  ``params["bias"]``, if present, is the bias on s_j (``model.class_capsules.use_bias``).
  Diagnostics per iteration: ``coupling_entropy``, ``coupling_max``, ``logit_change`` and
  ``preactivation_norm`` (mean |s_j|; long s_j saturate the squash).
  """
  del inputs, activations, rng, train  # Procedure 1 needs only the votes.
  s = settings
  result = dynamic_routing(votes, s["iterations"], softmax_axis=s["softmax_axis"],
                           stop_gradient=s["stop_gradient"], leaky=s["leaky"],
                           bias=(params or {}).get("bias"), squash_epsilon=s["squash_epsilon"],
                           return_trace=diagnostics)
  if not diagnostics:
    return RoutingResult(result, None, {})
  capsules, trace = result
  return RoutingResult(capsules, None, routing_diagnostics_per_example(trace, s["softmax_axis"]))


ROUTER = Router(name="dynamic", settings=SETTINGS, route=route, uses_parent_bias=True)
