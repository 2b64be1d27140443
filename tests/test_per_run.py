"""capsjax/config/per_run.py: a model's per-run numbers as a typed pytree, read from the
config and stacked over runs for jax.vmap."""

import jax
import ml_collections
import numpy as np
import pytest

from capsjax.config import per_run
from capsjax.common.errors import UsageError


@per_run.declare("loss")
class Numbers:
  """A model of one's own: one number its config must set, one with a default."""
  scale: float
  my_weight: float = 0.25


def test_a_models_own_numbers_read_the_config_else_their_defaults():
  assert per_run.config_keys(Numbers) == ("loss.scale", "loss.my_weight")
  assert per_run.config_keys(None) == ()
  got = per_run.of_config(Numbers, ml_collections.ConfigDict({"scale": 2.0}))
  assert got == Numbers(scale=2.0, my_weight=0.25)
  assert jax.tree.leaves(got) == [2.0, 0.25]
  with pytest.raises(UsageError, match=r"config\.loss\.scale is not set; every config sets it \(Numbers\.scale\)"):
    per_run.of_config(Numbers, ml_collections.ConfigDict({"my_weight": 1.0}))


def test_runs_numbers_stack_into_one_instance_that_vmap_maps_over():
  configs = [ml_collections.ConfigDict({"loss": {"scale": 1.0}}),
             ml_collections.ConfigDict({"loss": {"scale": 3.0, "my_weight": 0.5}})]
  stacked = per_run.stacked(Numbers, configs)
  assert isinstance(stacked, Numbers) and stacked.scale.dtype == np.float32
  np.testing.assert_array_equal(stacked.scale, [1.0, 3.0])
  np.testing.assert_array_equal(stacked.my_weight, [0.25, 0.5])
  np.testing.assert_allclose(jax.vmap(lambda n: n.scale * n.my_weight)(stacked), [0.25, 1.5])
  assert per_run.stacked(None, configs) is None
