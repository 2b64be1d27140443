"""Moved to :mod:`capsjax.config.runconfig` in 0.2.0; the old name serves import_config_file,
load with a DeprecationWarning for a release (CHANGELOG.md)."""

from capsjax.common import public_names

__getattr__ = public_names.module_getattr(__name__)
