"""SaturationWatch: when it warns, what it says."""

import numpy as np

from capsjax.models import saturation_watch as monitors


def _feed(watch, fractions, start=1, accuracy=0.05):
  steps = np.arange(start, start + len(fractions))
  return watch.update(steps, {"saturated_fraction": np.asarray(fractions, np.float32),
                              "accuracy": np.full(len(fractions), accuracy, np.float32)})


def test_warns_once_after_a_sustained_stretch_and_again_after_a_healthy_step():
  watch = monitors.SaturationWatch(fraction=0.9, steps=5, settings=("model.x", "optimizer.y"),
                                   chance=1 / 45)
  assert _feed(watch, [0.95] * 4) is None                   # 4 steps: not yet sustained.
  message = _feed(watch, [1.0, 1.0], start=5)                # Step 5 completes the stretch.
  assert message is not None and "up to step 5" in message
  assert "model.x, optimizer.y" in message and "chance is 2.2%" in message
  assert "train accuracy 5.0%" in message
  assert _feed(watch, [1.0] * 10, start=7) is None           # Same stretch: said once.
  assert _feed(watch, [0.5], start=17) is None               # A healthy step ends it ...
  assert _feed(watch, [0.92] * 4, start=18) is None
  assert "up to step 22" in _feed(watch, [0.92], start=22)   # ... and a new one warns again.


def test_a_stretch_spanning_several_updates_and_below_the_fraction():
  watch = monitors.SaturationWatch(fraction=0.9, steps=3)
  assert _feed(watch, [0.89] * 50) is None                   # Just below "nearly all".
  assert _feed(watch, [0.9, 0.9, 0.89, 0.9, 0.9], start=51) is None  # Broken stretches.
  assert _feed(watch, [0.9], start=56) is not None           # 54, 55, 56.


def test_silent_without_the_metric_or_when_switched_off():
  assert monitors.SaturationWatch(steps=1).update(np.arange(1, 4), {"accuracy": np.ones(3)}) \
      is None
  assert _feed(monitors.SaturationWatch(steps=0), [1.0] * 500) is None
