"""Moved into :mod:`capsjax.models.capsnet` in 0.2.0, beside the head it is built on; the
old name serves CapsuleModel with a DeprecationWarning for a release (CHANGELOG.md)."""

from capsjax.common import public_names

__getattr__ = public_names.module_getattr(__name__)
