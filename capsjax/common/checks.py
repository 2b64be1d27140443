"""Range checks of settings where they are read: a bad value is a UsageError naming its key."""

from __future__ import annotations

from capsjax.common.errors import UsageError


def count(value, key: str, minimum: int = 0) -> int:
  """``value`` of the setting ``key``, an integer of at least ``minimum`` (None counts as 0,
  as the configs' "0: all" settings read it), or a UsageError naming the key."""
  number = 0 if value is None else value
  if isinstance(number, bool) or not isinstance(number, int) or number < minimum:
    raise UsageError(f"{key} must be an integer >= {minimum}, got {value!r}.")
  return number


def names(value) -> tuple[str, ...]:
  """A setting that lists names, as a tuple: ``("fgsm", "bim")`` from that tuple, from
  ``"fgsm,bim"`` or from ``("fgsm,bim",)`` (what a command-line override such as
  ``--evals.adversarial.attacks=fgsm,bim`` parses to)."""
  items = (value,) if isinstance(value, str) else tuple(value or ())
  return tuple(part.strip() for item in items for part in str(item).split(",") if part.strip())
