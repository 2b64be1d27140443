"""Moved to :mod:`capsjax.config.per_run` in 0.2.0; the old name serves declare, config_keys,
of_config and stacked with a DeprecationWarning for a release (CHANGELOG.md)."""

from capsjax.common import public_names

__getattr__ = public_names.module_getattr(__name__)
