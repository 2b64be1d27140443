"""Mean ± standard deviation over seeds, as every table writes it."""

from __future__ import annotations

import decimal
import math


def mean_std(values) -> tuple[float, float | None]:
  """Mean and sample standard deviation of the values that are not None; the std is None for
  a single value (no spread to report), the mean NaN for none."""
  values = [v for v in values if v is not None]
  if not values:
    return float("nan"), None
  mean = sum(values) / len(values)
  if len(values) == 1:
    return mean, None
  return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def fixed(value: float, digits: int = 2) -> str:
  """``value`` with ``digits`` decimals, a half rounded up once the float's last bits are set
  aside: the same mean computed from float32 accuracies (16.0650001) and from counts
  (16.065, held as 16.06499...) reads 16.07 in every table."""
  if not math.isfinite(value):
    return f"{value:.{digits}f}"
  exact = decimal.Decimal(repr(round(value, 9)))
  return str(exact.quantize(decimal.Decimal(1).scaleb(-digits), rounding=decimal.ROUND_HALF_UP))


def mean_pm(mean: float, std: float | None, scale: float = 100.0, digits: int = 2) -> str:
  """``89.50 ± 0.30`` over several seeds; ``89.50`` for one (a seeds column says so)."""
  text = fixed(scale * mean, digits)
  return text if std is None else f"{text} ± {fixed(scale * std, digits)}"
