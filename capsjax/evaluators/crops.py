"""Scores averaged over several crops of each test image (type ``"crop_average"``): the
matrix-capsule code's ``--patching`` evaluation (google-research ``capsule_em``,
``norb/norb_record.py``), for datasets that crop (``config.data.crop``: smallNORB, CIFAR-10).

    c.evals.patching = dict(type="crop_average")

By default the 13 crops of the code: the central one, and the four diagonal neighbours at 1, 2
and 3 px (``(+-k, +-k)``); each is prepared as the evaluation's centre crop is (per-image
standardisation where the config has it), the model scores every one, and the class scores
are averaged per image. The authors report 1.8% smallNORB test error on the centre crop and
1.3% with these crops (the paper: 1.4%). Settings: ``offsets`` (``((dy, dx), ...)`` px from the
centre), ``split`` (test), ``limit`` (0: the whole split, after ``config.data.test_limit``).
Reports ``accuracy`` of the averaged scores, ``centre_accuracy`` (offset (0, 0), if listed),
``error``, ``crops`` and ``chance``.
"""

from __future__ import annotations

import jax
import numpy as np

from capsjax import evaluators
from capsjax.config.settings import NON_NEGATIVE, Setting
from capsjax.common.errors import UsageError
from capsjax.models import metrics
from capsjax.runs import reporting

# The code's 13 crops of smallNORB's test images: the centre, then 4 diagonal moves of 1, 2, 3 px.
CODE_OFFSETS = ((0, 0),) + tuple((k * dy, k * dx) for k in (1, 2, 3)
                                 for dy, dx in ((1, 1), (1, -1), (-1, 1), (-1, -1)))


class CropAverageEvaluator(evaluators.Evaluator):
  """Accuracy of class scores averaged over crops of each image."""
  type_name = "crop_average"
  SETTINGS = {"offsets": Setting(CODE_OFFSETS, "(dy, dx) of each crop from the centre one "
                                "(the code's 13)."),
              "split": Setting("test", "The split evaluated."),
              "limit": Setting(0, "Examples (0: all).", check=NON_NEGATIVE)}

  def __init__(self, *args):
    super().__init__(*args)
    where = f"config.evals.{self.name}"
    moved = getattr(self.builder, "eval_batch_moved", None)
    if moved is None or not getattr(self.builder, "crop", 0):
      raise UsageError(f"{where}: type 'crop_average' needs a dataset that crops its images "
                       f"(config.data.crop > 0, e.g. smallnorb); {self.config.dataset!r} "
                       "does not.")
    self.offsets = tuple(tuple(int(v) for v in o) for o in self.setting("offsets"))
    sample = self.limited(self._chosen_split()).sample(self.count("limit"))
    h, w = self.builder.stored_shape[:2]
    room = (h - self.builder.crop) // 2, (w - self.builder.crop) // 2
    if not self.offsets or any(abs(dy) > room[0] or abs(dx) > room[1]
                               for dy, dx in self.offsets):
      raise UsageError(f"{where}.offsets={self.offsets!r}: a {self.builder.crop}-px crop of "
                       f"{h}x{w} images moves at most {room} px from the centre.")
    # One set on the devices; each crop adds its offset, an argument of the one compiled step.
    centred = self.batched.eval_set(sample, moved)
    self.sets = [centred.with_shared(crop_offset=np.asarray(o, np.int32)) for o in self.offsets]
    self.num_classes = self.batched.task.dataset.info.num_classes

  def run(self, params) -> dict:
    total, labels, result = None, None, {}
    for n, ((dy, dx), crops) in enumerate(zip(self.offsets, self.sets), 1):
      scores, labels = self.batched.scores(params, crops)
      total = scores if total is None else total + scores
      if (dy, dx) == (0, 0):
        result["centre_accuracy"] = float(np.mean(np.argmax(scores, axis=1) == labels))
      if jax.process_index() == 0:
        reporting.count_progress(f"{self.name}: crop", n, len(self.offsets))
    accuracy = float(np.mean(np.argmax(total, axis=1) == labels))
    return {"accuracy": accuracy, "error": 1.0 - accuracy, **result,
            "crops": len(self.offsets), "chance": metrics.chance_levels(self.num_classes)[
                "accuracy"]}


# Registered under these names in the config (capsjax/config/registries.py).
EVALUATORS = {"crop_average": CropAverageEvaluator}
