"""evaluation.BatchedEval: any pure function of (variables, batch) mapped over a set on every
device, against NumPy over the same examples; sets that are not whole batches; gradients with
respect to the input through the task's forward function."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mnist
from capsjax import datasets
from capsjax.training import evaluation, tasks, train_step
from capsjax.training.setup import make_mesh
from helpers import write_idx_dataset


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  idx = write_idx_dataset(tmp_path_factory.mktemp("idx"), num_train=32, num_test=21)
  c = mnist.get_config("smoke")
  c.data.source, c.data.dir, c.data.test_limit = "idx", str(idx), 0
  task = tasks.Task.from_config(c)
  params, state = task.init_variables(jax.random.PRNGKey(0))
  batched = evaluation.BatchedEval(task, make_mesh(), batch_size=8)  # 21 = 8 + 8 + 5.
  test = task.dataset.load()["test"]
  return task, train_step.merge_variables(params, state), batched, test


def pixel_statistics(variables, batch):
  del variables
  images = batch["images"].reshape(batch["images"].shape[0], -1)
  return {"brightness": jnp.mean(images, axis=1),
          "corners": jnp.stack([images[:, 0], images[:, -1]], axis=1),
          "label": batch["labels"].astype(jnp.float32)}


def test_mean_and_collect_of_any_function_equal_numpy_over_the_set(setup):
  task, variables, batched, test = setup
  eval_set = batched.eval_set(test)
  assert (eval_set.size, eval_set.num_batches) == (21, 3)
  images = test.examples["images"].reshape(21, -1) / 255.0
  means = batched.mean(pixel_statistics, variables, eval_set)
  np.testing.assert_allclose(means["brightness"], images.mean(), rtol=1e-5)
  np.testing.assert_allclose(means["corners"], [images[:, 0].mean(), images[:, -1].mean()],
                             rtol=1e-5, atol=1e-7)
  assert means["label"] == pytest.approx(test.examples["labels"].mean())
  collected = batched.collect(pixel_statistics, variables, eval_set)
  assert collected["corners"].shape == (21, 2)
  np.testing.assert_allclose(collected["brightness"], images.mean(axis=1), rtol=1e-5)
  np.testing.assert_array_equal(collected["label"], test.examples["labels"])


def test_evaluate_is_the_mean_of_the_forward_function(setup):
  task, variables, batched, test = setup
  got = batched.evaluate(variables, batched.eval_set(test))
  batch = task.dataset.eval_batch(test.examples, {})
  once = jax.jit(lambda v, b: task.forward(v, b, train=False))(variables, batch)
  np.testing.assert_allclose(got["loss"], float(np.mean(once.loss)), rtol=1e-5)
  np.testing.assert_allclose(got["accuracy"], float(np.mean(once.metrics["accuracy"])))
  assert got["error"] == pytest.approx(1 - got["accuracy"])
  scores, labels = batched.scores(variables, batched.eval_set(test))
  np.testing.assert_allclose(scores, np.asarray(once.outputs.scores), rtol=1e-5, atol=1e-7)
  np.testing.assert_array_equal(labels, test.examples["labels"])


def test_an_input_gradient_through_the_runner_equals_one_outside_it(setup):
  """What an attack needs: d loss / d images through routing, per example, on the devices."""
  task, variables, batched, test = setup

  def input_gradient(variables, batch):
    loss = lambda images: jnp.sum(task.forward(variables, {**batch, "images": images},
                                               train=False).loss)
    grad = jax.grad(loss)(batch["images"])
    return {"gradient": grad.reshape(grad.shape[0], -1)}

  got = batched.collect(input_gradient, variables, batched.eval_set(test))["gradient"]
  batch = task.complete_batch(task.dataset.eval_batch(test.examples, {}))
  expected = np.asarray(jax.jit(input_gradient)(variables, batch)["gradient"])
  assert got.shape == (21, 28 * 28) and np.count_nonzero(got) > 0
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-7)


def test_a_set_of_float_images_evaluates_as_its_pixels(setup):
  _, variables, batched, test = setup
  floats = datasets.Split({**test.examples, "images": test.examples["images"] / np.float32(255)})
  a = batched.evaluate(variables, batched.eval_set(test))
  b = batched.evaluate(variables, batched.eval_set(floats))
  assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
