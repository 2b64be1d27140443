"""How tests/data/pre_injection_run was written, by the code of 0aa21b6 (before the peak
learning rate was optimiser state), from the repository root of that commit:

    python tests/data/pre_injection_run/written_by.py OUT

OUT/tiny: a tiny Efficient-CapsNet (BatchNorm, so the train state has model state) trained 2
steps on tests/helpers.py's generated IDX files (this folder keeps its config.json and
checkpoint); OUT/uninterrupted_step3.npz: its parameters and model state after that code
resumed it to step 3. tests/test_migrations.py resumes the checkpoint with today's code and
compares."""
import shutil
import sys

sys.path[:0] = ["configs", "tests"]

import jax  # noqa: E402
import numpy as np  # noqa: E402

import efficient_capsnet  # noqa: E402
from capsjax import train  # noqa: E402
from helpers import final_state, write_idx_dataset  # noqa: E402


def tiny(idx, steps):
  """The run's config (tests/test_migrations.py builds the same)."""
  c = efficient_capsnet.get_config("smoke")
  c.data.source, c.data.dir = "idx", str(idx)
  c.model.convs.features = (4, 4, 4, 8)
  c.model.primary.dim = 4
  c.model.class_capsules.dim = 4
  c.model.decoder.hidden = (4, 4)
  c.train.num_steps, c.train.checkpoint_every_steps = steps, 2
  c.eval.figures = False
  return c


if __name__ == "__main__":
  out = sys.argv[1]
  idx = write_idx_dataset(f"{out}/idx", 128, 64)
  train.train_and_evaluate(tiny(idx, 2), f"{out}/tiny")
  shutil.copytree(f"{out}/tiny", f"{out}/tiny3")
  train.train_and_evaluate(tiny(idx, 3), f"{out}/tiny3")
  state = final_state(f"{out}/tiny3")
  leaves = jax.tree_util.tree_flatten_with_path(
      {"params": state.params, "model_state": state.model_state})[0]
  np.savez(f"{out}/uninterrupted_step3.npz",
           **{"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
              for path, v in leaves})
