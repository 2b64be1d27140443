"""The whole matrix-capsule network (capsjax/models/em_capsnet.py) against a float64 NumPy
forward written from the authors' code (google-research ``capsule_em``: ``primary_caps``,
``conv_capsule_mat``, ``connector_capsule_mat``, ``spread_loss``; for variational Bayes, the
batch norms of fabio-deep/Variational-Capsule-Routing), at tiny sizes; and the routers'
documented values on degenerate inputs.

capsjax runs in float64 here (``jax.enable_x64``, its parameters cast), so the two must agree
to rounding: 1e-10. The routing loops come from the references of tests/test_em_routing.py and
tests/test_vb_routing.py; everything around them (the convolution, the primary capsules'
interleaved columns, the receptive-field centres of coordinate addition, the batch norms, the
spread loss and weight decay) is written here from the papers and the code.
"""

import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy.special import digamma

from capsjax import routing
from capsjax.models import em_capsnet
from capsjax.routing import em
from capsjax.routing import variational_bayes as vb
from capsjax.config.runconfig import import_config_file
from test_em_routing import np_conv_votes, np_em, np_groups, np_normalise, np_softmax
from test_vb_routing import np_vb, np_vb_positions

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
em_mnist = import_config_file(CONFIGS / "em_mnist.py")
SIZE, CLASSES, BATCH = 20, 3, 4   # conv1 5x5/2: 8x8; ConvCaps1 3x3/2: 3x3; ConvCaps2 3x3/1: 1x1.


def tiny_config(router="em"):
  """The code's network at tiny sizes, its class transforms drawn larger than the code's 0.01
  (so the class poses differ by class)."""
  config = em_mnist.em_model(conv1=5, primary=3, caps=(2, 3))
  config.image_shape, config.num_classes = (SIZE, SIZE, 1), CLASSES
  config.routing.name = router
  config.class_capsules.init_scale = 0.5
  return config


def float64_model(config):
  """The model with every floating parameter and statistic cast to float64 (call inside
  ``jax.enable_x64``)."""
  model = em_capsnet.EMCapsNet(config, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  state = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64)
                       if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
  return nnx.merge(graphdef, state)


def weights_of(model) -> dict:
  """The parameters as float64 NumPy arrays, by the code's names."""
  get = lambda p: np.asarray(p[...], np.float64)
  return {"conv1": (get(model.conv1.kernel), get(model.conv1.bias)),
          "pose_kernel": get(model.primary_capsules.pose_kernel),
          "activation_kernel": get(model.primary_capsules.activation_kernel),
          "caps": [(get(l.weights), get(l.router_params["beta_u"]),
                    get(l.router_params["beta_a"])) for l in model.conv_capsules],
          "class": (get(model.class_capsules.weights),
                    get(model.class_capsules.router_params["beta_u"]),
                    get(model.class_capsules.router_params["beta_a"]))}


def np_conv1(images, kernel, bias, stride):
  """VALID convolution with bias and ReLU, by loops over the output grid."""
  k = kernel.shape[0]
  out = (images.shape[1] - k) // stride + 1
  result = np.zeros((images.shape[0], out, out, kernel.shape[-1]))
  for y in range(out):
    for x in range(out):
      patch = images[:, stride * y:stride * y + k, stride * x:stride * x + k]
      result[:, y, x] = np.einsum("bhwc,hwco->bo", patch, kernel) + bias
  return np.maximum(result, 0.0)


def np_primary(features, pose_kernel, activation_kernel, types, atoms=16):
  """The code's ``primary_caps``: one 1x1 convolution by the kernels concatenated (poses'
  columns, then logits'), its outputs read as ``types`` groups of ``atoms + 1`` (so a type's
  pose and logit interleave both kernels' columns), ``sigmoid(logit - 1)``."""
  out = features @ np.concatenate([pose_kernel, activation_kernel], axis=1)
  groups = out.reshape(*out.shape[:3], types, atoms + 1)
  return groups[..., :atoms], 1.0 / (1.0 + np.exp(-(groups[..., atoms] - 1.0)))


def np_centres(size, stack):
  """Each position's receptive-field centre, in pixels from the image centre / 100 (the code's
  ``conv_pos``), by averaging the input grid over each window, layer after layer."""
  centres = [c / 100.0 for c in range(-(size // 2), (size + 1) // 2)]
  for kernel, stride in stack:
    n = (len(centres) - kernel) // stride + 1
    centres = [sum(centres[j * stride:j * stride + kernel]) / kernel for j in range(n)]
  return np.asarray(centres)


def np_conv_children(acts, k, stride, oh, ow):
  """Child activations ``(b, i*k*k, 1, oh*ow)`` in the votes' order, by loops."""
  b, _, _, i_types = acts.shape
  out = np.zeros((b, i_types * k * k, 1, oh * ow))
  for i in range(i_types):
    for dy in range(k):
      for dx in range(k):
        for y in range(oh):
          for x in range(ow):
            out[:, (i * k + dy) * k + dx, 0, y * ow + x] = acts[:, stride * y + dy,
                                                                stride * x + dx, i]
  return out


def np_class_votes(poses, weights, rows, columns):
  """Votes ``(b, h*w*types, classes, 1, 16)``: each child's pose times its type's transform,
  plus coordinate addition as the code has it (column to element 0, row to element 1)."""
  b, h, w, t, _ = poses.shape
  classes = weights.shape[1]
  votes = np.zeros((b, h, w, t, classes, 16))
  for y in range(h):
    for x in range(w):
      for i in range(t):
        for c in range(classes):
          vote = poses[:, y, x, i].reshape(b, 4, 4) @ weights[i, c]
          votes[:, y, x, i, c] = vote.reshape(b, 16)
      votes[:, y, x, :, :, 0] += columns[x]
      votes[:, y, x, :, :, 1] += rows[y]
  return votes.reshape(b, h * w * t, classes, 1, 16)


def np_batch_norm(x, axes, train):
  """PyTorch's BatchNorm without affine parameters (epsilon 1e-5): the batch's biased
  statistics over ``axes`` in training; at evaluation the running ones, still at their start
  (mean 0, variance 1) in a fresh model."""
  if not train:
    return x / math.sqrt(1.0 + 1e-5)
  mean = x.mean(axis=axes, keepdims=True)
  return (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + 1e-5)


def np_network(config, p, images, step, train=True):
  """The whole forward pass and loss: class activations ``(b, classes)``, class poses
  ``(b, classes, 16)``, the loss ``(b,)``."""
  router, class_settings = routing.resolve(config.routing)
  caps = config.conv_caps
  conv_settings = dict(class_settings)
  if router.name == "em":
    conv_settings.update(inverse_temperature=caps.inverse_temperature,
                         mass_epsilon=caps.mass_epsilon)
  features = np_conv1(images, *p["conv1"], config.conv1.stride)
  poses, acts = np_primary(features, p["pose_kernel"], p["activation_kernel"],
                           config.primary.types)
  for (weights, beta_u, beta_a), k, stride in zip(p["caps"], caps.kernel_sizes, caps.strides):
    i_types, o_types = weights.shape[0], weights.shape[3]
    votes, (oh, ow) = np_conv_votes(poses, weights, stride)
    children = np_conv_children(acts, k, stride, oh, ow)
    b = len(images)
    if router.name == "em":  # The code's grouping (tests/test_em_routing.py).
      groups = np_groups(i_types, k, o_types, oh, ow, stride, "code")
      mean, active = np_em(votes, children, beta_u, beta_a, conv_settings,
                           lambda lp: np_normalise(lp, groups, "code", i_types, k),
                           np.full(votes.shape[:4], 1 / o_types))
    else:  # Each child over all its parents (HEAD), then the two batch norms.
      groups = (np_groups(i_types, k, o_types, oh, ow, stride, "child")
                if conv_settings["conv_normalisation"] == "child" else None)
      mean, logits, _ = np_vb_positions(votes, children[:, :, 0], beta_u, beta_a,
                                        conv_settings, groups)
    poses = mean.reshape(b, o_types, oh, ow, 16).transpose(0, 2, 3, 1, 4)
    if router.name == "em":
      acts = active.reshape(b, o_types, oh, ow).transpose(0, 2, 3, 1)
    else:
      logits = logits.reshape(b, o_types, oh, ow).transpose(0, 2, 3, 1)
      acts = 1 / (1 + np.exp(-np_batch_norm(logits, (0, 1, 2), train)))
      poses = np_batch_norm(poses, (0, 1, 2, 4), train)
  stack = [(config.conv1.kernel_size, config.conv1.stride),
           *zip(caps.kernel_sizes, caps.strides)]
  centres = np_centres(config.image_shape[0], stack)
  weights, beta_u, beta_a = p["class"]
  votes = np_class_votes(poses, weights, centres, centres)
  children = acts.reshape(len(images), -1)[:, :, None, None]
  if router.name == "em":
    mean, scores = np_em(votes, children, beta_u, beta_a, class_settings,
                         lambda lp: np_softmax(lp, 2), np.full(votes.shape[:4], 1 / CLASSES))
    class_poses, scores = mean[:, :, 0], scores[:, :, 0]
  else:
    class_poses, logits, _ = np_vb(votes[:, :, :, 0], children[:, :, 0, 0], beta_u, beta_a,
                                   class_settings)
    scores = 1 / (1 + np.exp(-np_batch_norm(logits, (0,), train)))
    class_poses = np_batch_norm(class_poses, (0, 2), train)
  return scores, class_poses


def np_spread_loss(scores, labels, step, config_loss, p):
  """Eq. 3 with the code's margin ``0.2 + 0.79 sigmoid(min(10, step / 50000 - 4))``, averaged
  over the classes, plus ``weight_decay`` x the sum of ``|W|^2 / 2`` over the weights."""
  margin = 0.2 + 0.79 / (1 + math.exp(-min(10.0, step / 50000.0 - 4.0)))
  target = scores[np.arange(len(labels)), labels][:, None]
  per_class = np.maximum(0.0, margin - (target - scores)) ** 2
  per_class[np.arange(len(labels)), labels] = 0.0
  weights = [p["conv1"][0], p["pose_kernel"], p["activation_kernel"], p["class"][0],
             *(w for w, _, _ in p["caps"])]
  decay = config_loss.weight_decay * sum(0.5 * np.sum(w ** 2) for w in weights)
  return per_class.mean(axis=1) + decay


def inputs(seed=0):
  rng = np.random.default_rng(seed)
  images = rng.uniform(size=(BATCH, SIZE, SIZE, 1))
  images[:, 5:15, 8:11] += 1.0   # Some structure, so the routing has something to agree on.
  return images, np.arange(BATCH) % CLASSES


def run_capsjax(config, images, labels, step, train):
  model = float64_model(config)
  graphdef, state = nnx.split(model)
  batch = {"images": jnp.asarray(images), "labels": jnp.asarray(labels)}

  @jax.jit  # One program (op by op the routing loops compile for about a minute).
  def forward(state, batch):
    model = nnx.merge(graphdef, state)  # Training updates VB's running statistics here.
    outputs = model.apply(batch, train=train)
    loss, parts = model.loss(outputs, batch, step=jnp.asarray(step))
    return outputs.scores, outputs.class_capsules, loss, parts

  return model, jax.tree.map(np.asarray, forward(state, batch))


def test_the_em_network_equals_its_float64_numpy_forward():
  """conv1, the primary capsules in the code's interleaved layout, two convolutional EM
  layers (the code's grouping of a child's assignments, strides 2 and 1), class capsules with
  coordinate addition, spread loss and weight decay: to 1e-10."""
  config = tiny_config()
  images, labels = inputs()
  step = 120_000
  with jax.enable_x64(True):
    model, (scores, poses, loss, parts) = run_capsjax(config, images, labels, step, True)
  assert scores.dtype == np.float64
  p = weights_of(model)
  expected_scores, expected_poses = np_network(config, p, images, step)
  np.testing.assert_allclose(scores, expected_scores, rtol=1e-10, atol=1e-12)
  np.testing.assert_allclose(poses, expected_poses, rtol=1e-10, atol=1e-12)
  expected_loss = np_spread_loss(expected_scores, labels, step, em_capsnet.default_loss(), p)
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-10, atol=1e-14)
  # Not a vacuous agreement: at the code's small inverse temperatures an untrained network's
  # class activations differ by a few 1e-6 (0.144 each), which 1e-10 resolves; the poses
  # differ by class and example.
  assert np.ptp(scores) > 1e-6 and np.ptp(poses) > 0.01
  assert np.all(parts["spread_loss"] > 0)


@pytest.mark.parametrize("train", [True, False], ids=["train", "evaluation"])
def test_the_variational_bayes_network_equals_its_float64_numpy_forward(train):
  """routing.name='variational_bayes' on the same layers: VB at every routed layer (the
  authors' code at HEAD: each child normalised over all the parents whose receptive fields
  hold it, the clamped normaliser), the batch norms of the parents' activation logits and poses
  with the batch's statistics in training and the running ones at evaluation."""
  config = tiny_config("variational_bayes")
  images, labels = inputs(1)
  with jax.enable_x64(True):
    model, (scores, poses, _, _) = run_capsjax(config, images, labels, 0, train)
  expected_scores, expected_poses = np_network(config, weights_of(model), images, 0, train)
  np.testing.assert_allclose(scores, expected_scores, rtol=1e-10, atol=1e-12)
  np.testing.assert_allclose(poses, expected_poses, rtol=1e-10, atol=1e-12)
  assert np.ptp(scores) > 1e-6 and np.ptp(poses) > 1e-3


def em_route64(votes, acts, beta_u, beta_a, **settings):
  """Fully connected EM routing in float64 with its diagnostics."""
  with jax.enable_x64(True):
    result = em.route(jnp.asarray(votes, jnp.float64),
                      activations=jnp.asarray(acts, jnp.float64),
                      params={"beta_u": jnp.asarray(beta_u, jnp.float64),
                              "beta_a": jnp.asarray(beta_a, jnp.float64)},
                      settings=dict(em.ROUTER.defaults, **settings), diagnostics=True)
    return jax.tree.map(np.asarray, result)


def test_em_with_every_child_inactive_gives_the_documented_parents():
  """No child active: each parent's mass is mass_epsilon, its mean 0, its variance the floor,
  so its logit is lambda (eps (-D log min_var - beta_u D (log 2 pi + 1)) - 5000 beta_a), at
  every iteration (em.py's docstring)."""
  rng = np.random.default_rng(0)
  beta_u, beta_a = np.array([0.5, 2.0, -1.0]), np.array([1e-4, -2e-4, 0.0])
  result = em_route64(rng.normal(size=(2, 7, 3, 16)), np.zeros((2, 7)), beta_u, beta_a)
  s, d = em.ROUTER.defaults, 16
  lam = s["inverse_temperature"] * (1 - s["temperature_growth"] ** s["iterations"])
  cost = s["mass_epsilon"] * (-d * math.log(s["min_variance"])
                              - beta_u * d * (math.log(2 * math.pi) + 1))
  logit = lam * (cost - s["activation_bias_scale"] * beta_a)
  np.testing.assert_array_equal(result.capsules, 0.0)
  np.testing.assert_allclose(result.activations, np.broadcast_to(1 / (1 + np.exp(-logit)),
                                                                 (2, 3)), rtol=1e-12)
  np.testing.assert_allclose(result.diagnostics["log_sigma"],
                             0.5 * math.log(s["min_variance"]), rtol=1e-12)


def test_em_with_identical_votes_puts_the_variance_at_its_floor():
  """Every child votes the same pose V for every parent (whose betas are equal). Every parent
  then explains every child equally, so R stays 1/3 and each parent's weight is
  W = 6 x 0.5 / 3 = 1; by hand,
  mean_t = (1 - damping) V W / (W + eps) + damping mean_(t-1) and variance_t = min_var +
  W (V - mean_t)^2 / (W + eps): without damping the floor, but for (V eps / W)^2 (1e-10)."""
  rng = np.random.default_rng(1)
  vote = np.broadcast_to(rng.normal(size=(1, 1, 1, 16)), (1, 1, 3, 16))  # Parents alike.
  votes, acts = np.broadcast_to(vote, (1, 6, 3, 16)), np.full((1, 6), 0.5)
  w, eps, floor = 1.0, em.ROUTER.defaults["mass_epsilon"], em.ROUTER.defaults["min_variance"]
  for damping in (0.0, em.ROUTER.defaults["mean_damping"]):
    result = em_route64(votes, acts, np.zeros(3), np.zeros(3), mean_damping=damping)
    mean = np.zeros_like(vote[:, 0])
    for t in range(em.ROUTER.defaults["iterations"]):
      mean = (1 - damping) * vote[:, 0] * w / (w + eps) + damping * mean
      variance = floor + w * (vote[:, 0] - mean) ** 2 / (w + eps)
      np.testing.assert_allclose(result.diagnostics["log_sigma"][:, t],
                                 0.5 * np.mean(np.log(variance)), rtol=1e-12)
    np.testing.assert_allclose(result.capsules, mean, rtol=1e-12)
    if damping == 0:
      np.testing.assert_allclose(variance, floor, rtol=1e-6)


def test_vb_with_every_child_inactive_keeps_the_prior():
  """No child active: each parent's posterior is its prior (mean m0 = 0) and its activation
  logit beta_a - (exp(E ln pi) H + beta_u), with E ln pi = digamma(alpha0) - digamma(K alpha0)
  and H the prior's expected entropy, the same for every parent."""
  rng = np.random.default_rng(2)
  s = dict(vb.ROUTER.defaults)
  beta_u, beta_a = rng.normal(size=3), rng.normal(size=3)
  with jax.enable_x64(True):
    result = vb.vb_routing(jnp.asarray(rng.normal(size=(2, 5, 3, 1, 16))),
                           jnp.zeros((2, 5, 1, 1)), jnp.asarray(beta_u), jnp.asarray(beta_a),
                           settings=s)
    poses, logits = np.asarray(result.poses), np.asarray(result.activation_logits)
  d = 16
  nu0 = d + s["prior_nu_offset"]
  e_log_lambda = (sum(digamma((nu0 + 1 - i) / 2) for i in range(1, d + 1)) + d * math.log(2)
                  + d * math.log(s["prior_psi"]))
  entropy = 0.5 * d * math.log(2 * math.pi * math.e) - 0.5 * e_log_lambda
  e_log_pi = digamma(s["prior_alpha"]) - digamma(3 * s["prior_alpha"])
  np.testing.assert_array_equal(poses, 0.0)
  np.testing.assert_allclose(logits[:, :, 0], np.broadcast_to(
      beta_a - (math.exp(e_log_pi) * entropy + beta_u), (2, 3)), rtol=1e-12)
