"""Moved to :mod:`capsjax.config.settings` in 0.2.0; the old name serves Setting, REQUIRED, Rule,
POSITIVE, NON_NEGATIVE, at_least, above, between, one_of, each, usually with a DeprecationWarning
for a release (CHANGELOG.md)."""

from capsjax.common import public_names

__getattr__ = public_names.module_getattr(__name__)
