"""capsjax.evaluators.attacks: FGSM against its closed form on a linear model, PGD's one step
against FGSM, the budget and the range, gradients through the routing iterations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from capsjax.evaluators import attacks


def linear_loss(weights, labels):
  def loss_fn(images):
    log_p = jax.nn.log_softmax(images @ weights)
    return attacks.cross_entropy(log_p, labels), log_p
  return loss_fn


def test_fgsm_on_a_two_class_linear_model_is_its_closed_form():
  rng = np.random.default_rng(0)
  weights = jnp.asarray(rng.normal(size=(6, 2)), jnp.float32)
  labels = jnp.asarray([0, 1, 1, 0])
  images = jnp.asarray(rng.uniform(0.3, 0.7, (4, 6)), jnp.float32)
  moved = attacks.fgsm(linear_loss(weights, labels), images, 0.1)
  # d(-log p_y)/dx = p_other (w_other - w_true): its sign is that of w_other - w_true.
  other = weights[:, 1 - labels].T
  expected = images + 0.1 * np.sign(other - weights[:, labels].T)
  np.testing.assert_allclose(moved, expected, atol=1e-6)
  gradient, _ = attacks.input_gradient(linear_loss(weights, labels), images)
  np.testing.assert_array_equal(
      attacks.fgsm(linear_loss(weights, labels), images, 0.1, gradient=gradient), moved)
  # At the edge of the range the step is clipped.
  edge = attacks.fgsm(linear_loss(weights, labels), jnp.ones((4, 6)), 0.1)
  np.testing.assert_allclose(edge, np.minimum(1.0, 1.0 + 0.1 * np.sign(
      other - weights[:, labels].T)), atol=1e-6)


def test_pgd_one_step_without_random_start_is_fgsm_and_zero_budget_moves_nothing():
  rng = np.random.default_rng(1)
  weights = jnp.asarray(rng.normal(size=(5, 3)), jnp.float32)
  labels = jnp.asarray([0, 1, 2, 2])
  images = jnp.asarray(rng.uniform(0, 1, (4, 5)), jnp.float32)
  loss_fn = linear_loss(weights, labels)
  np.testing.assert_allclose(attacks.pgd(loss_fn, images, 0.2, steps=1, step_size=0.2),
                             attacks.fgsm(loss_fn, images, 0.2), atol=1e-7)
  np.testing.assert_array_equal(attacks.fgsm(loss_fn, images, 0.0), images)
  np.testing.assert_array_equal(
      attacks.pgd(loss_fn, images, 0.0, steps=3, step_size=0.0, key=jax.random.PRNGKey(0)),
      images)


@pytest.mark.parametrize("random_start", [False, True])
def test_pgd_stays_in_the_budget_and_the_range_and_raises_the_loss(random_start):
  rng = np.random.default_rng(2)
  weights = jnp.asarray(rng.normal(size=(8, 4)), jnp.float32)
  labels = jnp.asarray(rng.integers(0, 4, 16))
  images = jnp.asarray(rng.uniform(0, 1, (16, 8)), jnp.float32)
  loss_fn = linear_loss(weights, labels)
  key = jax.random.PRNGKey(3) if random_start else None
  moved = attacks.pgd(loss_fn, images, 0.25, steps=5, step_size=0.1, key=key)
  assert float(jnp.max(jnp.abs(moved - images))) <= 0.25 + 1e-6
  assert float(jnp.min(moved)) >= 0 and float(jnp.max(moved)) <= 1
  assert float(jnp.mean(loss_fn(moved)[0])) > float(jnp.mean(loss_fn(images)[0]))


def test_targets_are_the_next_class():
  np.testing.assert_array_equal(attacks.target_labels(jnp.asarray([0, 3, 9]), 10), [1, 4, 0])


def test_the_input_gradient_goes_through_the_couplings():
  """The attacks' input gradient flows through the routing's agreement, not only through its
  last weighted sum: with 3 iterations it differs from the gradient with the couplings'
  gradient stopped (``routing.stop_gradient``, the reimplementations' choice); with one
  iteration, which has no agreement step, the two are equal. (1 vs 3 iterations differing, the
  test this replaces, also held with the couplings' gradient stopped.)"""
  import mnist

  from capsjax.training import tasks

  def input_gradient(iterations, stop_gradient):
    config = mnist.get_config("smoke")
    config.model.routing.iterations = iterations
    config.model.routing.stop_gradient = stop_gradient
    task = tasks.Task.from_config(config)
    variables = nnx.to_pure_dict(nnx.state(task.model(nnx.Rngs(0))))  # Seed 0: the same.
    images = jax.random.uniform(jax.random.PRNGKey(0), (2, *task.config.model.image_shape))
    labels = jnp.asarray([3, 7])

    def loss_fn(x):
      out = task.forward(variables, {"images": x, "labels": labels}, train=False)
      return attacks.cross_entropy(out.outputs.log_probabilities, labels), None

    # One program: op by op, the gradient through the routing took about 15 s.
    return jax.jit(lambda x: attacks.input_gradient(loss_fn, x)[0])(images)

  through, stopped = input_gradient(3, False), input_gradient(3, True)
  assert float(jnp.max(jnp.abs(through))) > 0
  assert not np.allclose(through, stopped, rtol=1e-2, atol=1e-7)
  np.testing.assert_allclose(input_gradient(1, False), input_gradient(1, True), rtol=1e-6,
                             atol=1e-9)


def _capsnet_task(iterations=3):
  import mnist

  from capsjax.training import tasks

  config = mnist.get_config("smoke")
  config.model.routing.iterations = iterations
  task = tasks.Task.from_config(config)
  model = task.model(nnx.Rngs(0))
  return task, model, nnx.to_pure_dict(nnx.state(model))


def test_vote_scores_are_the_lengths_of_the_squashed_mean_vote():
  """Gu et al. 2021's surrogate, re-derived in NumPy from the layer's weights."""
  task, model, variables = _capsnet_task()
  images = jax.random.uniform(jax.random.PRNGKey(1), (3, *task.config.model.image_shape))
  poses = np.asarray(model.primary(images).poses, np.float64)  # (batch, in_caps, in_dim)
  weights = np.asarray(model.class_capsules.weights[...], np.float64)  # (i, j, d, k)
  mean_vote = np.einsum("bik,ijdk->bjd", poses, weights) / poses.shape[1]
  squared = np.sum(mean_vote ** 2, axis=-1)
  expected = squared / (1 + squared)  # |squash(s)| = |s|^2 / (1 + |s|^2), Eq. 1.
  got = model.vote_scores({"images": images, "labels": jnp.zeros(3, jnp.int32)})
  np.testing.assert_allclose(np.asarray(got), expected, rtol=2e-5, atol=1e-7)
  log_p = task.vote_log_probabilities(variables, {"images": images,
                                                  "labels": jnp.zeros(3, jnp.int32)})
  np.testing.assert_allclose(np.asarray(log_p), np.log(np.exp(expected) / np.exp(
      expected).sum(1, keepdims=True)), rtol=1e-5, atol=1e-6)
  assert "votes" in task.capabilities


def test_the_vote_gradient_skips_the_routing():
  """With dynamic routing the vote attack's gradient is not the model's; the surrogate is the
  same whatever the iterations (it has no routing)."""
  surrogate, through_model = [], []
  for iterations in (1, 3):
    task, _, variables = _capsnet_task(iterations)  # The same parameters (seed 0) each time.
    images = jax.random.uniform(jax.random.PRNGKey(0), (2, *task.config.model.image_shape))
    batch = {"images": images, "labels": jnp.asarray([3, 7])}

    @jax.jit  # One program each (op by op the four gradients took ~25 s of compilations).
    def gradients(variables, x):
      def vote_loss(x):
        log_p = task.vote_log_probabilities(variables, {**batch, "images": x})
        return attacks.cross_entropy(log_p, batch["labels"]), None

      def model_loss(x):
        out = task.forward(variables, {**batch, "images": x}, train=False)
        return attacks.cross_entropy(out.outputs.log_probabilities, batch["labels"]), None

      return (attacks.input_gradient(vote_loss, x)[0],
              attacks.input_gradient(model_loss, x)[0])

    vote_gradient, model_gradient = gradients(variables, images)
    surrogate.append(vote_gradient)
    through_model.append(model_gradient)
  assert float(jnp.max(jnp.abs(surrogate[0]))) > 0
  np.testing.assert_allclose(surrogate[0], surrogate[1], rtol=1e-6, atol=1e-9)
  assert not np.allclose(surrogate[1], through_model[1], rtol=1e-2, atol=1e-7)
