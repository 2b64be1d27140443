"""The arithmetic every router shares: norms, the two squashes, the votes, one pass of coupling.

Pure JAX, no Flax. Shapes: votes ``(batch, in_caps, out_caps, out_dim)``, coupling
``(batch, in_caps, out_caps)``, parent capsules ``(batch, out_caps, out_dim)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# The router interface (re-exported here, its home until 0.2.0).
from capsjax.routing.router import (SQUASH_EPSILON, ConvLayer, ParamSpec, Router,  # noqa: F401
                                    RoutingResult, check_iterations, iterations_setting,
                                    per_iteration)


def safe_norm(x: jax.Array, axis: int = -1, epsilon: float = 0.0,
              keepdims: bool = False) -> jax.Array:
  """Euclidean norm ``sqrt(sum(x**2) + epsilon)`` with a finite gradient at 0.

  ``jnp.linalg.norm`` has a NaN gradient at the zero vector (0/0). Here the
  square root only ever sees positive numbers, and the zero vector gets norm
  ``sqrt(epsilon)`` and gradient 0 (the subgradient of minimum norm).

  Args:
    x: any array.
    axis: the vector axis.
    epsilon: added under the square root; 0 gives the exact norm.
    keepdims: keep the reduced axis with size 1.

  Returns:
    The norms, ``x``'s shape without ``axis`` (or with size 1 there).
  """
  squared = jnp.sum(jnp.square(x), axis=axis, keepdims=keepdims) + epsilon
  positive = squared > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, squared, 1.0)), 0.0)


def squash(s: jax.Array, axis: int = -1, epsilon: float = 0.0) -> jax.Array:
  """The squashing non-linearity, Eq. 1: ``v = |s|^2/(1+|s|^2) * s/|s|``.

  Short vectors shrink to almost zero length and long vectors to a length
  just below 1; the direction is kept.

  Args:
    s: capsule pre-activations, vectors along ``axis``.
    axis: the capsule-vector axis.
    epsilon: added under the square root of ``|s|`` in the denominator, as many
      public implementations do (1e-7, 1e-8, 1e-9 are common). The paper's
      Eq. 1 has none, which is the default 0; the gradient is finite at the
      zero vector either way.

  Returns:
    ``v`` with the shape of ``s``; ``|v| < 1``.
  """
  squared = jnp.sum(jnp.square(s), axis=axis, keepdims=True)
  norm = safe_norm(s, axis=axis, epsilon=epsilon, keepdims=True)
  scale = squared / (1.0 + squared) / jnp.where(norm > 0, norm, 1.0)
  return scale * s


def exp_squash(s: jax.Array, axis: int = -1) -> jax.Array:
  """Efficient-CapsNet's squash (Mazzia et al. 2021, Eq. 5): ``v = (1 - e^{-|s|}) s/|s|``.

  Steeper near zero than Eq. 1. Written as ``-expm1(-|s|)/|s| * s``, whose factor tends to 1 at
  the zero vector, so value and gradient are finite there without the reference code's fuzz
  factor (``eps = 1e-20`` in ``(1 - 1/(e^{|s|} + eps)) s/(|s| + eps)``).

  Returns:
    ``v`` with the shape of ``s``; ``|v| < 1``.
  """
  norm = safe_norm(s, axis=axis, keepdims=True)
  positive = norm > 0
  safe = jnp.where(positive, norm, 1.0)
  return jnp.where(positive, -jnp.expm1(-safe) / safe, 1.0) * s


@jax.custom_vjp
def capsule_votes(capsules: jax.Array, weights: jax.Array) -> jax.Array:
  """Prediction vectors u_hat_{j|i} = W_ij u_i (paper, Eq. 2), W not tiled over the batch.

  Args:
    capsules: child capsules u_i, ``(batch, in_caps, in_dim)``.
    weights: W_ij, ``(in_caps, out_caps, out_dim, in_dim)``.

  Returns:
    votes, ``(batch, in_caps, out_caps, out_dim)``.
  """
  return jnp.einsum("bik,ijdk->bijd", capsules, weights)


def _capsule_votes_fwd(capsules, weights):
  return capsule_votes(capsules, weights), (capsules, weights)


def _capsule_votes_bwd(residuals, votes_grad):
  # Both gradients are matmuls batched over children i. Written with the vote
  # gradient child-major, (in_caps, batch, out_caps*out_dim), XLA:CPU transposes
  # it once; from autodiff of the einsum it made two transposed copies
  # (docs/performance.md has the timings).
  capsules, weights = residuals
  in_caps, out_caps, out_dim, in_dim = weights.shape
  grad = jnp.transpose(votes_grad, (1, 0, 2, 3)).reshape(in_caps, -1, out_caps * out_dim)
  capsules_grad = jnp.einsum("ibe,iek->bik", grad,
                             weights.reshape(in_caps, out_caps * out_dim, in_dim))
  weights_grad = jnp.einsum("ibk,ibe->iek", jnp.transpose(capsules, (1, 0, 2)), grad)
  return capsules_grad, weights_grad.reshape(weights.shape)


capsule_votes.defvjp(_capsule_votes_fwd, _capsule_votes_bwd)


def matrix_votes(poses: jax.Array, weights: jax.Array) -> jax.Array:
  """Votes of matrix capsules, V_ij = M_i W_ij (Hinton, Sabour & Frosst 2018, Sec. 2): each
  child's ``p x p`` pose matrix times a learned ``p x p`` transform per (child, parent).

  Args:
    poses: child poses M_i flattened, ``(batch, in_caps, p * p)`` (p = 4 in the paper).
    weights: W_ij, ``(in_caps, out_caps, p, p)``.

  Returns:
    votes flattened, ``(batch, in_caps, out_caps, p * p)``: every router takes them as it
    takes vector votes.
  """
  batch, in_caps, _ = poses.shape
  _, out_caps, p, _ = weights.shape
  matrices = poses.reshape(batch, in_caps, p, p)
  votes = jnp.einsum("bipq,ijqr->bijpr", matrices, weights)
  return votes.reshape(batch, in_caps, out_caps, p * p)


def coupling_statistics(coupling: jax.Array, axis: int = 2) -> dict[str, jax.Array]:
  """Per example: the mean entropy (nats) of the coupling distributions along ``axis`` and
  the mean of their largest coefficient.

  Args:
    coupling: ``(batch, in_caps, out_caps)``, each distribution along ``axis``.

  Returns:
    A dict, ``{"coupling_entropy": (batch,), "coupling_max": (batch,)}``. Uniform over n
    parents gives ``log n`` and ``1/n``; a one-hot coupling 0 and 1.
  """
  c = coupling
  entropy = -jnp.sum(jnp.where(c > 0, c * jnp.log(jnp.where(c > 0, c, 1.0)), 0.0), axis=axis)
  peak = jnp.max(c, axis=axis)
  return {"coupling_entropy": jnp.mean(entropy.reshape(c.shape[0], -1), axis=1),
          "coupling_max": jnp.mean(peak.reshape(c.shape[0], -1), axis=1)}


def coupled_parents(votes: jax.Array, coupling: jax.Array, *, bias: jax.Array | None = None,
                    squash_epsilon: float = 0.0, diagnostics: bool = False):
  """One pass without agreement: ``v_j = squash(sum_i c_ij u_hat_{j|i} + bias)`` (Eq. 1-2).

  Args:
    votes: ``(batch, in_caps, out_caps, out_dim)``; coupling ``(batch, in_caps, out_caps)``.
    bias: optional ``(out_caps, out_dim)`` on s_j.

  Returns:
    A :class:`RoutingResult`; its diagnostics (one iteration, when asked for):
    ``coupling_entropy``, ``coupling_max``, ``preactivation_norm`` (mean |s_j|).
  """
  preactivation = jnp.einsum("bijd,bij->bjd", votes, coupling)
  if bias is not None:
    preactivation = preactivation + bias
  capsules = squash(preactivation, epsilon=squash_epsilon)
  if not diagnostics:
    return RoutingResult(capsules, None, {})
  measured = coupling_statistics(coupling)
  measured["preactivation_norm"] = jnp.mean(safe_norm(preactivation), axis=1)
  return RoutingResult(capsules, None, {k: v[:, None] for k, v in measured.items()})
