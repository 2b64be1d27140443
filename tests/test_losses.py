"""Losses against hand-computed values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from capsjax.models import losses


def test_margin_loss_hand_computed():
  lengths = jnp.asarray([[0.95, 0.5, 0.05], [0.2, 0.3, 0.8]])
  labels = jnp.asarray([0, 2])
  # Example 0: present class 0.95 >= 0.9 -> 0; absent 0.5: 0.5*(0.4)^2 = 0.08; absent 0.05 -> 0.
  # Example 1: present 0.8: (0.1)^2 = 0.01; absent 0.2: 0.5*0.01; 0.3: 0.5*0.04.
  expected = (0.08 + (0.01 + 0.005 + 0.02)) / 2
  np.testing.assert_allclose(float(losses.margin_loss(lengths, labels)), expected, rtol=1e-6)


def test_margin_loss_parameters_are_used():
  lengths = jnp.asarray([[0.5, 0.5]])
  labels = jnp.asarray([0])
  got = losses.margin_loss(lengths, labels, m_plus=0.7, m_minus=0.2, lam=1.0)
  np.testing.assert_allclose(float(got), 0.2**2 + 0.3**2, rtol=1e-6)


def test_reconstruction_loss_is_weighted_sum_not_mean():
  images = jnp.zeros((2, 28, 28, 1))
  recon = jnp.full((2, 28, 28, 1), 0.5)
  # Sum over 784 pixels of 0.25 = 196 per example; times 0.0005 = 0.098.
  np.testing.assert_allclose(float(losses.reconstruction_loss(recon, images)), 0.098, rtol=1e-6)
  np.testing.assert_allclose(float(losses.reconstruction_loss(recon, images, weight=1.0)), 196.0,
                             rtol=1e-6)


def test_reconstruction_loss_is_the_squared_difference_with_the_targets():
  """Targets of 0.2 and 0.9 under reconstructions of 0.5 (errors of both signs): half the
  pixels give 0.09, half 0.16, so 392 x 0.25 = 98 per example; example 1 doubled (its
  reconstruction 0.5 against 0.0 and 1.0: 0.25 each, 196). Not (r + t)^2, r^2 - t^2 or
  |r - t|."""
  targets = np.zeros((2, 28, 28, 1), np.float32)
  targets[0, :14], targets[0, 14:] = 0.2, 0.9
  targets[1, :14], targets[1, 14:] = 0.0, 1.0
  recon = jnp.full((2, 28, 28, 1), 0.5)
  per_example = losses.reconstruction_loss_per_example(recon, jnp.asarray(targets), weight=1.0)
  np.testing.assert_allclose(np.asarray(per_example), [98.0, 196.0], rtol=1e-6)
  np.testing.assert_allclose(float(losses.reconstruction_loss(recon, jnp.asarray(targets),
                                                              weight=1.0)), 147.0, rtol=1e-6)


def test_reconstruction_loss_shape_mismatch():
  with pytest.raises(ValueError, match="same shape"):
    losses.reconstruction_loss(jnp.zeros((2, 784)), jnp.zeros((2, 28, 28, 1)))


def test_margin_loss_with_two_labels_counts_both_as_present():
  lengths = jnp.asarray([[0.95, 0.5, 0.05, 0.7]])
  labels = jnp.asarray([[0, 3]])
  # Present 0.95 -> 0 and 0.7 -> (0.2)^2 = 0.04; absent 0.5 -> 0.5*(0.4)^2 = 0.08, 0.05 -> 0.
  np.testing.assert_allclose(np.asarray(losses.margin_loss_per_example(lengths, labels)),
                             [0.04 + 0.08], rtol=1e-6)


def test_reconstruction_loss_of_two_digits_adds_their_sums():
  targets = jnp.zeros((1, 2, 3, 3, 1)).at[0, 1].set(1.0)  # Digit 2 all ones.
  recon = jnp.full((1, 2, 3, 3, 1), 0.5)
  # Digit 1: 9 * 0.25; digit 2: 9 * 0.25; sum 4.5, times 0.0005.
  np.testing.assert_allclose(np.asarray(losses.reconstruction_loss_per_example(recon, targets)),
                             [4.5 * 0.0005], rtol=1e-6)


def test_a_capsule_models_per_run_numbers_are_its_loss_settings_fields():
  """``LossSettings`` is the capsule models' per-run numbers: a pytree whose leaves are its
  fields (what a vectorised step maps over), each read from ``loss.<field>`` (a new field
  needs no second list), and the loss given one run's numbers computes with those, not the
  head's."""
  import dataclasses

  import ml_collections

  from capsjax.config import per_run
  from capsjax.models.capsnet import CapsuleModel, capsule_loss
  from capsjax.models.head_settings import LossSettings
  from capsjax.models.outputs import Outputs

  fields = [f.name for f in dataclasses.fields(LossSettings)]
  assert CapsuleModel.per_run_numbers is LossSettings
  assert per_run.config_keys(LossSettings) == tuple(f"loss.{name}" for name in fields)
  assert set(fields) == {"m_plus", "m_minus", "lam", "reconstruction_weight", "margin_weight"}
  run = LossSettings(m_plus=0.8, m_minus=0.2, lam=0.25, reconstruction_weight=0.0,
                     margin_weight=0.05)
  assert jax.tree.leaves(run) == [0.8, 0.2, 0.25, 0.0, 0.05]
  section = ml_collections.ConfigDict({"m_plus": 0.8, "margin_weight": 0.05})
  assert LossSettings.from_config(section) == dataclasses.replace(
      LossSettings(), m_plus=0.8, margin_weight=0.05)  # The others their declared defaults.
  two = per_run.stacked(LossSettings, [ml_collections.ConfigDict({"loss": section}),
                                       ml_collections.ConfigDict({})])
  np.testing.assert_allclose(two.m_plus, [0.8, LossSettings().m_plus])

  rng = np.random.default_rng(0)
  lengths = jnp.asarray(rng.uniform(0, 1, size=(8, 10)), jnp.float32)
  outputs = Outputs(scores=lengths, predictions=jnp.argmax(lengths, -1),
                    log_probabilities=jnp.log(lengths))
  batch = {"labels": jnp.asarray(rng.integers(0, 10, size=8))}
  given, _ = capsule_loss(outputs, batch, run, traced=True)
  own, _ = capsule_loss(outputs, batch, run)
  default, _ = capsule_loss(outputs, batch, LossSettings())
  np.testing.assert_allclose(given, own, rtol=1e-6)
  assert not np.allclose(given, default, rtol=1e-2)