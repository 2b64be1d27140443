"""The shared set-up path (capsjax/training/setup.py): the initial state it builds."""

import jax
import numpy as np

import mnist
from capsjax.training import setup as setup_lib, train_step
from capsjax.training.setup import Setup


def test_initialisation_compiled_for_speed_gives_the_same_bits(idx_dir):
  """``fresh_state`` compiles with :data:`INIT_COMPILER_OPTIONS` (LLVM -O1 on a CPU, for its
  compile time): the same parameters and optimiser state, bit for bit, as the program compiled
  with XLA's defaults (the smoke CapsNet: truncated normals, uniforms, constants; measured the
  same for Efficient-CapsNet, EM and the baseline CNN when the option was chosen)."""
  assert setup_lib.INIT_COMPILER_OPTIONS["cpu"] == {"xla_backend_optimization_level": 1}
  for module in (mnist,):
    config = module.get_config("smoke")
    config.data.source, config.data.dir = "idx", str(idx_dir)
    setup = Setup(config)
    fresh = setup.fresh_state()
    tx = setup.optimizer.tx
    default = jax.jit(lambda: train_step.init_state(setup.task, tx),
                      out_shardings=setup.replicated)()
    leaves = list(zip(jax.tree.leaves(fresh), jax.tree.leaves(default)))
    assert len(leaves) > 10 and jax.tree.structure(fresh) == jax.tree.structure(default)
    for a, b in leaves:
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Not a vacuous comparison: the parameters are random draws, not constants.
    kernels = [np.asarray(x) for x in jax.tree.leaves(fresh.params) if np.ndim(x) >= 2]
    assert sum(np.std(k) > 0 for k in kernels) >= 3, [k.shape for k in kernels]
