"""Errors a researcher can fix: bad config values, missing or corrupt data.

The command-line entry points print these as one clear message, without a
traceback, and exit with status 2.
"""


class UsageError(ValueError):
  """A problem with the inputs (config, flags, data) rather than with capsjax."""


class NonFiniteLossError(RuntimeError):
  """Training produced a NaN or infinite loss."""
