"""Convolutional capsules (:class:`ConvCapsules`): capsules over receptive fields, one ``p x p``
transform per (input type, kernel offset, output type), a layer of the capsule stack
(:mod:`capsjax.models.capsule_layers`) that takes any router.

Routers that declare ``route_layer`` (EM and variational Bayes) see the whole layer, since a
child in several receptive fields shares its assignments among all the parents that hold it
(``normalisation`` for EM, as in the authors' code; VB's ``conv_normalisation``;
:mod:`capsjax.models.receptive_fields`); the layer hands them a :class:`capsjax.routing.ConvLayer`.
EM's ``normalisation``:

* ``"code"`` (default): the code's ``update_conv_routing``. For each child type and output type
  separately, the assignments are ``exp(log p - max)`` divided by their sum over the (parent
  position, kernel offset) pairs ``(y, dy)`` with the same ``y + dy``: the children of a stride-1
  convolution. At stride 2 these groups are not the true children (child ``2y + dy``), and since
  output types are normalised separately, after the first iteration (which starts at ``1 /
  out_types``) output types no longer compete for a child.
* ``"child"``: each true child's assignments sum to one over every parent whose receptive field
  holds it (all output types and positions), as the paper describes EM.
* ``"patch"``: a softmax over output types at each (parent position, kernel offset), each
  receptive field routed on its own, as most reimplementations do.

Every other router routes each receptive field on its own (positions folded into the batch), its
parameters shared over positions; a parent's length is its activation where the router gives none.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from capsjax import routing as routing_lib
from capsjax.common.errors import UsageError
from capsjax.models import layers
from capsjax.models import receptive_fields as fields
from capsjax.models.capsule_layers import parameter_values, router_parameters, split_routing
from capsjax.models.matrix_capsules import RoutingNorms, check_routing_norms


class ConvCapsules(nnx.Module):
  """Convolutional capsules over each parent's receptive field (VALID), matrix votes: the vote of
  child i at offset (dy, dx) for output type o is ``M_i W[i, dy, dx, o]``; routed as the module
  docstring says. Parameters: ``in_types k^2 out_types p^2`` and the router's (EM's and VB's
  ``beta_u`` and ``beta_a`` per output type, the code's sigma_biases and activation_biases)."""

  def __init__(self, in_types: int, out_types: int, kernel: int, stride: int, pose_size: int,
               *, init_scale: float, routing: tuple | dict, normalisation: str = "code",
               routing_norms: bool = False, rngs: nnx.Rngs):
    """``routing``: ``(router, settings)`` or ``{"name": ..., **settings}``, every setting
    filled in (EM's, the code's: inverse temperature 0.01, mass epsilon 1e-7, beta inits 0.5);
    ``normalisation``: EM's (module docstring); ``routing_norms``: VB's batch norms of the
    parents."""
    router, self.settings_items = split_routing(routing)
    if normalisation not in fields.NORMALISATIONS:
      raise UsageError(f"config.model.conv_caps.normalisation must be one of "
                       f"{fields.NORMALISATIONS}, got {normalisation!r}.")
    check_routing_norms(routing_norms, router)
    self.weights = nnx.Param(layers.kernel_init(init_scale)(
        rngs.params(), (in_types, kernel, kernel, out_types, pose_size, pose_size)))
    dim = pose_size * pose_size
    self.router_params = nnx.data(router_parameters(
        router, in_types * kernel * kernel, dim, out_types, dim, dict(self.settings_items), rngs))
    self.router = router
    self.kernel, self.stride, self.pose_size = kernel, stride, pose_size
    self.normalisation = normalisation
    self.norms = nnx.data(RoutingNorms(out_types, rngs=rngs) if routing_norms else None)

  def votes(self, poses: jax.Array) -> jax.Array:
    """``(batch, h, w, in_types, p*p)`` -> ``(batch, in_types * k * k, out_types, oh * ow,
    p*p)`` (children of a receptive field, parents, positions, pose)."""
    p, k = self.pose_size, self.kernel
    patches = layers.valid_patches(poses, k, k, self.stride)  # (b, oh, ow, k, k, i, pp)
    b, oh, ow, _, _, i, _ = patches.shape
    matrices = patches.reshape(b, oh, ow, k, k, i, p, p)
    votes = jnp.einsum("bpqhwirc,ihwocd->bihwopqrd", matrices, self.weights[...])
    return votes.reshape(b, i * k * k, votes.shape[4], oh * ow, p * p)

  def __call__(self, poses: jax.Array, activations: jax.Array, *, train: bool = False,
               rng: jax.Array | None = None, diagnostics: bool = False):
    """Poses ``(batch, h, w, in_types, p*p)`` and activations ``(batch, h, w, in_types)`` -> the
    parents' poses ``(batch, oh, ow, out_types, p*p)``, activations ``(batch, oh, ow, out_types)``
    and the routing diagnostics ``{name: (batch, iterations)}`` (per receptive field routers: the
    mean over positions). ``train``: VB's batch norms use (and update) the batch's statistics;
    ``rng``: for routers that draw."""
    b, h, w, i, _ = poses.shape
    k, s = self.kernel, self.stride
    oh, ow = (h - k) // s + 1, (w - k) // s + 1
    votes = self.votes(poses)
    child_activations = layers.valid_patches(activations, k, k, s)  # (b, oh, ow, k, k, i)
    child_activations = child_activations.transpose(0, 5, 3, 4, 1, 2).reshape(
        b, i * k * k, 1, oh * ow)
    params = parameter_values(self.router_params)
    settings = dict(self.settings_items)
    out_types = votes.shape[2]
    if self.router.route_layer is not None:
      grid = fields.ReceptiveFieldGrid(i, k, s, oh, ow)
      layer = routing_lib.ConvLayer(
          num_children=i * h * w, normalisation=self.normalisation, child_sum=grid.child_sum,
          normaliser=lambda mode, epsilon: fields.conv_normaliser(mode, i, k, s, oh, ow, epsilon))
      result = self.router.route_layer(votes, activations=child_activations, params=params,
                                       settings=settings, layer=layer, diagnostics=diagnostics)
      # With the batch norms, the logits are normalised before the sigmoid (VB's code).
      means, activations, measured = (
          result.capsules, result.activations if self.norms is None else result.activation_logits,
          result.diagnostics)
    else:
      means, activations, measured = self._route_fields(
          votes, poses, child_activations, params, settings, train, rng, diagnostics)
    poses = means.reshape(b, out_types, oh, ow, -1).transpose(0, 2, 3, 1, 4)
    activations = activations.reshape(b, out_types, oh, ow).transpose(0, 2, 3, 1)
    if self.norms is not None:
      activations, poses = self.norms(activations, poses, train=train)
    return poses, activations, measured

  def _route_fields(self, votes, poses, child_activations, params, settings, train, rng,
                    diagnostics):
    """Any router, each receptive field on its own: the positions join the batch."""
    b, n, o, positions, d = votes.shape
    k = self.kernel
    field_votes = votes.transpose(0, 3, 1, 2, 4).reshape(b * positions, n, o, d)
    children = layers.valid_patches(poses, k, k, self.stride)  # (b, oh, ow, k, k, i, d)
    children = jnp.moveaxis(children, 5, 3).reshape(b * positions, n, d)
    field_activations = child_activations[:, :, 0].transpose(0, 2, 1).reshape(b * positions, n)
    result = self.router.route(
        field_votes, inputs=children, activations=field_activations, params=params, rng=rng,
        settings=settings, train=train, diagnostics=diagnostics)
    parents = result.capsules.reshape(b, positions, o, d).transpose(0, 2, 1, 3)
    activations = (result.activations if result.activations is not None
                   else routing_lib.safe_norm(result.capsules))
    activations = activations.reshape(b, positions, o).transpose(0, 2, 1)
    measured = {k: jnp.mean(v.reshape(b, positions, -1), axis=1)
                for k, v in result.diagnostics.items()}
    return parents, activations, measured
