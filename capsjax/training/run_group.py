"""Deprecated: the training driver moved to :mod:`capsjax.training.driver` (CHANGELOG.md);
importing this name gives that module, with a DeprecationWarning, for a release."""

import sys
import warnings

from capsjax.training import driver

warnings.warn("capsjax.training.run_group moved to capsjax.training.driver; the old name will "
              "be removed in a later release (CHANGELOG.md).", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = driver
