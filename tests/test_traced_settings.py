"""capsjax/common/traced_settings.py: the deprecated dict of one run's settings keeps working
for a release, and says where its replacement is."""

import pytest

from capsjax.common import traced_settings


def test_a_setting_passed_is_the_runs_and_one_not_passed_the_configs_with_a_warning():
  settings = {"loss.m_plus": 0.8}
  with pytest.warns(DeprecationWarning, match=r"capsjax\.common\.per_run"):
    assert traced_settings.value(settings, "loss.m_plus", 0.9) == 0.8
  with pytest.warns(DeprecationWarning):
    assert traced_settings.value(settings, "loss.lam", 0.5) == 0.5
    assert traced_settings.value(None, "loss.m_plus", 0.9) == 0.9
    assert traced_settings.is_traced(settings, "loss.m_plus")
    assert not traced_settings.is_traced(settings, "loss.lam")
    assert not traced_settings.is_traced(None, "loss.m_plus")
