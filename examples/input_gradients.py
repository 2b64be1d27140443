"""An evaluator of one's own that takes gradients with respect to the input: FGSM.

    python -m capsjax.main --config=examples/config.py:evaluator --workdir=/tmp/ex_eval
    # in any config: config.evals.fgsm = dict(type="examples/input_gradients.py:FGSM",
    #                                        epsilon=0.1)

capsjax's own ``type="adversarial"`` (``capsjax/evaluators/adversarial.py``) runs FGSM, PGD and
BIM over several budgets with checks against gradient masking; this file shows how an evaluator
of one's own is written. The fast gradient sign method (Goodfellow et al. 2015): each test image moved by
``epsilon * sign(d loss / d image)``, clipped to [0, 1], where the loss is the cross-entropy of
the model's ``outputs.log_probabilities`` (every model has them). It reports

  ``accuracy``           on the moved images (``clean_accuracy``: on the images as they are);
  ``zero_gradient``      the fraction of examples whose input gradient is exactly zero: an
                         attack cannot move those, so a large fraction means the accuracy
                         under attack overstates robustness (gradient masking).

The evaluator writes one pure function of ``(variables, batch)`` with ``jax.grad`` of the
task's forward function (``batched.task.forward``) and hands it to ``batched.mean``, which maps
it over the set on every device (sharded, padded, jitted once). The batch it receives has its
``reconstruction_targets`` already: moving the images does not move what a capsule model is
asked to reconstruct. Images must lie in [0, 1] (MNIST-style data, not standardised images).
"""

import jax
import jax.numpy as jnp

from capsjax import evaluators
from capsjax.common.errors import UsageError


class FGSM(evaluators.Evaluator):
  """Settings: ``epsilon`` (L-infinity budget), ``split``."""
  # Its settings and their defaults; any other key in config.evals.NAME is refused.
  SETTINGS = {"epsilon": 0.1, "split": "test"}

  def __init__(self, *args):
    super().__init__(*args)
    self.epsilon = float(self.setting("epsilon"))
    if not 0 <= self.epsilon <= 1:
      raise UsageError(f"config.evals.{self.name}.epsilon must lie in [0, 1], got "
                       f"{self.epsilon!r}.")
    split = self.setting("split")
    if split not in self.splits:
      raise UsageError(f"config.evals.{self.name}.split={split!r}: the dataset has "
                       f"{tuple(self.splits)}.")
    self.set = self.batched.eval_set(self.limited(self.splits[split]))
    self.attacked = self._attacked  # One object: it keys the batched's jit cache.

  def _attacked(self, variables, batch) -> dict:
    forward, labels = self.batched.task.forward, batch["labels"]

    def cross_entropy(images):
      outputs = forward(variables, {**batch, "images": images}, train=False).outputs
      picked = jnp.take_along_axis(outputs.log_probabilities, labels[:, None], axis=1)
      return -jnp.sum(picked), outputs.predictions

    gradient, clean = jax.grad(cross_entropy, has_aux=True)(batch["images"])
    moved = jnp.clip(batch["images"] + self.epsilon * jnp.sign(gradient), 0.0, 1.0)
    attacked = forward(variables, {**batch, "images": moved}, train=False).outputs.predictions
    flat = gradient.reshape(gradient.shape[0], -1)
    return {"accuracy": (attacked == labels).astype(jnp.float32),
            "clean_accuracy": (clean == labels).astype(jnp.float32),
            "zero_gradient": jnp.all(flat == 0, axis=1).astype(jnp.float32)}

  def run(self, variables) -> dict:
    result = self.batched.mean(self.attacked, variables, self.set)
    return {**result, "error": 1.0 - result["accuracy"], "epsilon": self.epsilon}
