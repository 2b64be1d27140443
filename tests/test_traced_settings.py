"""capsjax/common/traced_settings.py: one run's settings passed as data, and the record of
which the step read."""

from capsjax.common import traced_settings


def test_a_setting_passed_is_the_runs_and_one_not_passed_the_configs():
  settings = {"loss.m_plus": 0.8}
  assert traced_settings.value(settings, "loss.m_plus", 0.9) == 0.8
  assert traced_settings.value(settings, "loss.lam", 0.5) == 0.5
  assert traced_settings.value(None, "loss.m_plus", 0.9) == 0.9
  assert traced_settings.is_traced(settings, "loss.m_plus")
  assert not traced_settings.is_traced(settings, "loss.lam")
  assert not traced_settings.is_traced(None, "loss.m_plus")


def test_a_recording_names_the_keys_read_and_only_those():
  recording = traced_settings.Recording({"a": 1.0, "b": 2.0, "c": 3.0})
  assert traced_settings.value(recording, "a", 0.0) == 1.0
  assert recording.get("b") == 2.0 and recording.get("z") is None
  assert "z" not in recording
  assert recording.reads == {"a", "b"}
