"""Moved into :mod:`capsjax.models.capsnet` (the head with the paper's model) and
:mod:`capsjax.models.head_settings` (its settings) in 0.2.0; the old names serve
with a DeprecationWarning for a release (CHANGELOG.md)."""

from capsjax.common import public_names

__getattr__ = public_names.module_getattr(__name__)
