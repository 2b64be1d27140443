"""Paired comparison of two setups on the same examples: which examples only one of them gets
wrong, and whether that could be chance.

Three seeds with a spread of 0.04 points cannot separate two MNIST setups 0.04 points apart
(4 digits of 10,000); the same 10,000 digits scored by both can. For one pair of runs
(setup A's and B's of one seed) **McNemar's exact test** (McNemar 1947, Psychometrika 12:153;
recommended for comparing two classifiers on one test set by Dietterich 1998, Neural
Computation 10:1895): of the ``n = only_a + only_b`` examples exactly one of the two gets
wrong, under the null hypothesis each is equally likely to be A's or B's, so ``only_a`` is
Binomial(n, 1/2); the two-sided p is ``min(1, 2 P(X <= min(only_a, only_b)))``.

**Combined over seeds**: the exact sign-flip (randomisation) test on each example's summed
difference ``d_i = sum over seed pairs of (A wrong - B wrong)`` (Fisher 1935, The Design of
Experiments, Sec. 21; Pitman 1937): under the null hypothesis that A and B are interchangeable,
``d_i`` is as likely as ``-d_i``, so ``T = sum d_i`` is distributed as ``sum s_i |d_i|`` with
independent fair signs; p is ``P(|T0| >= |T|)``, computed exactly. Why this one: the examples
are the sampled units and every seed pair scores the same ones, so a hard digit is often
discordant in several seed pairs at once. Pooling the discordant counts of all seed pairs into
one McNemar test (the stratified or Mantel-Haenszel form) would count such a digit once per
seed as if independent and overstate the evidence; flipping the sign of a digit's whole sum
keeps that dependence. With one seed pair the two tests are the same.

Host-side NumPy and ``math`` only.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from capsjax.common.errors import UsageError
from capsjax.runs.predictions import Predictions

SIGNIFICANCE = 0.05  # Where a table says "not separated".


def fair_binomial(n: int) -> np.ndarray:
  """``P(X = k)`` for ``k = 0..n``, X ~ Binomial(n, 1/2), float64 (from log-gamma: exact to
  rounding; tails below 1e-308 are 0)."""
  k = np.arange(n + 1)
  log_choose = (math.lgamma(n + 1) - np.array([math.lgamma(i + 1) + math.lgamma(n - i + 1)
                                               for i in k]))
  return np.exp(log_choose - n * math.log(2.0))


def binomial_two_sided(k: int, n: int, p: float) -> float:
  """The exact two-sided p of ``k`` successes in ``n`` trials of probability ``p``: the
  probability of every count no more likely than ``k`` (as ``scipy.stats.binomtest``)."""
  if n == 0:
    return 1.0
  counts = np.arange(n + 1)
  log = np.array([math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                  for i in counts])
  with np.errstate(divide="ignore"):
    log = log + counts * np.log(p) + (n - counts) * np.log1p(-p)
  pmf = np.exp(log)
  return float(min(1.0, pmf[pmf <= pmf[k] * (1 + 1e-7)].sum()))


def mcnemar_exact(only_a: int, only_b: int) -> float:
  """McNemar's exact two-sided p: ``min(1, 2 P(X <= min(only_a, only_b)))`` for
  X ~ Binomial(only_a + only_b, 1/2); 1 when no example is discordant."""
  n = int(only_a) + int(only_b)
  if n == 0:
    return 1.0
  return float(min(1.0, 2.0 * fair_binomial(n)[:min(only_a, only_b) + 1].sum()))


def sign_flip_exact(differences: np.ndarray) -> float:
  """The exact two-sided p of the sign-flip test on integer paired differences ``d_i``:
  ``P(|sum s_i |d_i|| >= |sum d_i|)`` with independent fair signs ``s_i``; 1 when all are 0.

  Exact: the examples of each magnitude ``m`` contribute ``m (2 K_m - c_m)`` with
  K_m ~ Binomial(c_m, 1/2), and those distributions are convolved."""
  d = np.asarray(differences, np.int64)
  magnitudes, counts = np.unique(np.abs(d[d != 0]), return_counts=True)
  if not len(magnitudes):
    return 1.0
  # Y = sum_m m K_m on 0..S; the statistic's null distribution is 2 Y - S.
  distribution = np.ones(1)
  for m, c in zip(magnitudes.tolist(), counts.tolist()):
    spread = np.zeros(m * c + 1)
    spread[::m] = fair_binomial(c)
    distribution = np.convolve(distribution, spread)
  total = int(np.abs(d).sum())
  observed = abs(int(d.sum()))
  statistic = np.abs(2 * np.arange(total + 1) - total)
  return float(min(1.0, distribution[statistic >= observed].sum()))


@dataclasses.dataclass
class PairCounts:
  """Two runs on the same examples: how many each gets wrong alone, both, neither."""
  only_a: int
  only_b: int
  both: int
  neither: int

  @property
  def total(self) -> int:
    return self.only_a + self.only_b + self.both + self.neither

  @property
  def errors(self) -> tuple[int, int]:
    return self.only_a + self.both, self.only_b + self.both

  @property
  def p_value(self) -> float:
    return mcnemar_exact(self.only_a, self.only_b)

  @classmethod
  def of(cls, wrong_a: np.ndarray, wrong_b: np.ndarray) -> "PairCounts":
    wrong_a, wrong_b = np.asarray(wrong_a, bool), np.asarray(wrong_b, bool)
    return cls(int(np.sum(wrong_a & ~wrong_b)), int(np.sum(~wrong_a & wrong_b)),
               int(np.sum(wrong_a & wrong_b)), int(np.sum(~wrong_a & ~wrong_b)))


def aligned(a: Predictions, b: Predictions, what: str = "the two runs") -> tuple[np.ndarray, np.ndarray]:
  """Rows of ``a`` and of ``b`` holding the same examples, in order of id: the examples both
  evaluated. Raises UsageError when an id they share holds different inputs or labels (other
  data, another order of tensorflow-datasets' files, other padding) or none is shared."""
  common, rows_a, rows_b = np.intersect1d(a.id, b.id, assume_unique=True, return_indices=True)
  if not len(common):
    raise UsageError(f"{what} evaluated no example in common (no id is in both): they ran "
                     "on different data.")
  differ = np.flatnonzero((a.digest[rows_a] != b.digest[rows_b])
                          | np.any((a.label[rows_a] != b.label[rows_b]).reshape(len(common), -1),
                                   axis=1))
  if len(differ):
    raise UsageError(f"{what} do not hold the same examples: {len(differ)} of the "
                     f"{len(common)} ids they share (first: {int(common[differ[0]])}) hold "
                     "other inputs or labels. Compare runs of the same data (data.source, "
                     "data.dir, data.pad); tensorflow-datasets orders MNIST differently from "
                     "the IDX files.")
  return rows_a, rows_b


@dataclasses.dataclass
class Comparison:
  """Setups A and B compared on the examples each seed pair shares.

  Attributes:
    seeds: the seeds paired (A's seed k with B's seed k).
    counts: :class:`PairCounts` per seed pair, on all shared examples.
    halves: ``{"first", "second"}`` -> PairCounts per seed pair on the examples whose id is
      below / from half of the source split (MNIST: test[:5000], which LeCun's page calls the
      cleaner half but on which CapsNet and the CNN measured here err more,
      docs/results/test_halves_cpu.md; and test[5000:]).
    half_size: that boundary.
    combined_p: the sign-flip test over examples on the summed differences (all seed pairs).
    examples: the examples each seed pair shares (the first pair's count where they differ).
  """
  seeds: list
  counts: list[PairCounts]
  halves: dict[str, list[PairCounts]]
  half_size: int
  combined_p: float
  examples: int

  def verdict(self, a: str = "A", b: str = "B") -> str:
    """Which setup is lower where the combined test separates them; "not separated"."""
    errors_a = sum(c.errors[0] for c in self.counts)
    errors_b = sum(c.errors[1] for c in self.counts)
    if self.combined_p >= SIGNIFICANCE or errors_a == errors_b:
      return f"not separated ({p_text(self.combined_p)})"
    lower = a if errors_a < errors_b else b
    return f"{lower} lower ({p_text(self.combined_p)})"


def compare(pairs: list[tuple[object, Predictions, Predictions]]) -> Comparison:
  """:class:`Comparison` of ``[(seed, A's predictions, B's predictions)]``."""
  if not pairs:
    raise UsageError("No pair of runs to compare: the two sides share no seed.")
  counts, halves, summed = [], {"first": [], "second": []}, {}
  half_size = pairs[0][1].source_size // 2
  for seed, a, b in pairs:
    rows_a, rows_b = aligned(a, b, f"the runs of seed {seed}")
    wrong_a, wrong_b = ~a.correct[rows_a], ~b.correct[rows_b]
    counts.append(PairCounts.of(wrong_a, wrong_b))
    ids = a.id[rows_a]
    first = ids < half_size
    halves["first"].append(PairCounts.of(wrong_a[first], wrong_b[first]))
    halves["second"].append(PairCounts.of(wrong_a[~first], wrong_b[~first]))
    for i, d in zip(ids.tolist(), (wrong_a.astype(int) - wrong_b.astype(int)).tolist()):
      summed[i] = summed.get(i, 0) + d
  return Comparison([seed for seed, _, _ in pairs], counts, halves, half_size,
                    sign_flip_exact(np.array(list(summed.values()), np.int64)),
                    counts[0].total)


def format_p(p: float) -> str:
  """``0.031``, ``0.0004``, ``< 1e-12``."""
  if p < 1e-12:
    return "< 1e-12"
  return f"{p:.2g}" if p < 0.001 else f"{p:.3f}".rstrip("0").rstrip(".") if p < 1 else "1"


def p_text(p: float) -> str:
  """``p = 0.031``, ``p < 1e-12``."""
  text = format_p(p)
  return f"p {text}" if text.startswith("<") else f"p = {text}"


def halves_test(counts: dict[str, list[PairCounts]], side: int) -> tuple[int, int, float]:
  """One side's errors in the first and the second half (summed over seed pairs) and the exact
  binomial p that an error is as likely in either half, given the halves' sizes."""
  first = sum(c.errors[side] for c in counts["first"])
  second = sum(c.errors[side] for c in counts["second"])
  share = sum(c.total for c in counts["first"]) / max(
      1, sum(c.total for c in counts["first"] + counts["second"]))
  return first, second, binomial_two_sided(first, first + second, share)


def percent(wrong: int, total: int) -> str:
  return f"{100 * wrong / total:.2f}" if total else "-"


def mean_std(values: list[float]) -> str:
  """``0.37 ± 0.04`` (sample std over seeds), the value alone for one."""
  if len(values) == 1:
    return f"{values[0]:.2f}"
  mean = sum(values) / len(values)
  std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
  return f"{mean:.2f} ± {std:.2f}"


def markdown(result: Comparison, name_a: str, name_b: str) -> str:
  """The comparison as text: each side's error (%) on all shared examples and on each half,
  the discordant counts and McNemar's p per seed pair, the combined test and its verdict."""
  def errors(counts: list[PairCounts], side: int) -> str:
    return mean_std([100 * c.errors[side] / c.total for c in counts if c.total])

  h = result.half_size
  lines = [
      f"A: {name_a}", f"B: {name_b}", "",
      f"Test error (%), {len(result.seeds)} seed pair(s), mean ± std over seeds; the halves "
      f"by id in the source's order (MNIST's files: [:{h}] and [{h}:]):", "",
      "| examples | A | B |", "|---|---|---|",
      f"| all ({result.examples}) | {errors(result.counts, 0)} | {errors(result.counts, 1)} |",
      f"| ids < {h} ({result.halves['first'][0].total}) | {errors(result.halves['first'], 0)} "
      f"| {errors(result.halves['first'], 1)} |",
      f"| ids >= {h} ({result.halves['second'][0].total}) | "
      f"{errors(result.halves['second'], 0)} | {errors(result.halves['second'], 1)} |", "",
      "Per seed pair: the examples only A gets wrong, only B, both; McNemar's exact p "
      "(all examples, and each half):", "",
      "| seed | A wrong | B wrong | only A | only B | both | p | p, ids < half | p, ids >= half |",
      "|---|---|---|---|---|---|---|---|---|"]
  for k, (seed, c) in enumerate(zip(result.seeds, result.counts)):
    first, second = result.halves["first"][k], result.halves["second"][k]
    lines.append(f"| {seed} | {c.errors[0]} | {c.errors[1]} | {c.only_a} | {c.only_b} | "
                 f"{c.both} | {format_p(c.p_value)} | {format_p(first.p_value)} | "
                 f"{format_p(second.p_value)} |")
  lines += ["", f"Combined over the seed pairs (the exact sign-flip test on each example's "
                f"summed difference; capsjax/runs/paired.py says why): {result.verdict()}.", ""]
  for side, name in ((0, "A"), (1, "B")):
    first, second, p = halves_test(result.halves, side)
    lines.append(f"{name}'s errors in the halves, over its seeds: {first} and {second} "
                 f"(exact binomial test that an error is as likely in either half: "
                 f"{p_text(p)}).")
  lines.append("")
  return "\n".join(lines)


def as_json(result: Comparison) -> dict:
  """The comparison as JSON-able data."""
  counts = lambda cs: [dataclasses.asdict(c) | {"p": c.p_value} for c in cs]
  return {"seeds": result.seeds, "examples": result.examples, "half_size": result.half_size,
          "pairs": counts(result.counts),
          "halves": {name: counts(cs) for name, cs in result.halves.items()},
          "combined_p": result.combined_p, "verdict": result.verdict(),
          "errors_by_half": {side: dict(zip(("first", "second", "p"),
                                            halves_test(result.halves, k)))
                             for k, side in enumerate("ab")}}
