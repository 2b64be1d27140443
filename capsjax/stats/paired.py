"""Paired comparison of two setups on the same examples, and its two verdicts: about *these
trained models* (the test digits as the units, the trained runs fixed) and about *the setup*
(the training runs as the units: :mod:`capsjax.stats.seed_pairs`). A difference of setups is
separated only by the second.

Three seeds with a spread of 0.04 points cannot separate two MNIST setups 0.04 points apart
(4 digits of 10,000); the same 10,000 digits scored by both tell whether the trained models differ,
not whether the setups do. For one pair of runs (setup A's and B's of one seed) **McNemar's exact
test** (McNemar 1947, Psychometrika 12:153; recommended for comparing two classifiers on one test
set by Dietterich 1998, Neural Computation 10:1895): of the ``n = only_a + only_b`` examples
exactly one of the two gets wrong, under the null hypothesis each is equally likely to be A's or
B's, so ``only_a`` is Binomial(n, 1/2); the two-sided p is
``min(1, 2 P(X <= min(only_a, only_b)))``.

**Combined over seeds**: the exact sign-flip (randomisation) test on each example's summed
difference ``d_i = sum over seed pairs of (A wrong - B wrong)`` (Fisher 1935, The Design of
Experiments, Sec. 21; Pitman 1937): under the null hypothesis that A and B are interchangeable,
``d_i`` is as likely as ``-d_i``, so ``T = sum d_i`` is distributed as ``sum s_i |d_i|`` with
independent fair signs; p is ``P(|T0| >= |T|)``, computed exactly. Why this one: the examples
are the sampled units and every seed pair scores the same ones, so a hard digit is often
discordant in several seed pairs at once. Pooling the discordant counts of all seed pairs into
one McNemar test (the stratified or Mantel-Haenszel form) would count such a digit once per
seed as if independent and overstate the evidence; flipping the sign of a digit's whole sum
keeps that dependence. With one seed pair the two tests are the same. Both tests hold the
trained models fixed: they are the verdict about these trained models.

Runs are paired by seed where a side holds several; two runs named directly form one pair
whatever their seeds. Each pair is compared on the examples both of its runs evaluated (by id,
their inputs checked equal); a pair that shares none is refused, a half of the source's order
that holds none of the shared examples says so.

Host-side NumPy and ``math`` only.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from capsjax.common.errors import UsageError
from capsjax.runs.predictions import Predictions
from capsjax.stats import seed_pairs, spread

SIGNIFICANCE = seed_pairs.SIGNIFICANCE  # Where a verdict says "not separated".


def fair_binomial(n: int) -> np.ndarray:
  """``P(X = k)`` for ``k = 0..n``, X ~ Binomial(n, 1/2), float64 (from log-gamma: exact to
  rounding; tails below 1e-308 are 0)."""
  log_choose = math.lgamma(n + 1) - np.array([math.lgamma(i + 1) + math.lgamma(n - i + 1)
                                              for i in range(n + 1)])
  return np.exp(log_choose - n * math.log(2.0))


def binomial_two_sided(k: int, n: int, p: float) -> float:
  """The exact two-sided p of ``k`` successes in ``n`` trials of probability ``p``: the
  probability of every count no more likely than ``k`` (as ``scipy.stats.binomtest``)."""
  if n == 0:
    return 1.0
  if p <= 0 or p >= 1:  # Certain: only one count is possible.
    return 1.0 if k == (n if p >= 1 else 0) else 0.0
  counts = np.arange(n + 1)
  log = np.array([math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in counts])
  with np.errstate(divide="ignore"):
    pmf = np.exp(log + counts * np.log(p) + (n - counts) * np.log1p(-p))
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


def aligned(a: Predictions, b: Predictions,
            what: str = "the two runs") -> tuple[np.ndarray, np.ndarray]:
  """Rows of ``a`` and of ``b`` holding the same examples, in order of id: the examples both
  evaluated. Raises UsageError when an id they share holds different inputs or labels (other
  data, another order of tensorflow-datasets' files, other padding) or none is shared."""
  common, rows_a, rows_b = np.intersect1d(a.id, b.id, assume_unique=True, return_indices=True)
  if not len(common):
    raise UsageError(f"{what} evaluated no example in common (no id is in both): other "
                     "data, or other samples of it (data.test_limit scores a random sample; "
                     "--config.data.test_limit=0 scores the whole test set).")
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
    seeds: the seed pairs' labels: the seed where both runs have it, ``"0/1"`` (A's/B's).
    counts: :class:`PairCounts` per seed pair, on all shared examples.
    halves: ``{"first", "second"}`` -> PairCounts per seed pair on the examples whose id is
      below / from half of the source split (MNIST: test[:5000], which LeCun's page calls the
      cleaner half but on which CapsNet and the CNN measured here err more,
      docs/results/test_halves_cpu.md; and test[5000:]); a half may hold none.
    half_size: that boundary.
    combined_p: the sign-flip test over examples on the summed differences (all seed pairs).
    own: per seed pair, the examples A's run and B's run each evaluated.
    setup: the verdict about the setup (:class:`capsjax.stats.seed_pairs.SetupTest`).
    distinct: how many examples the seed pairs share in all (each counted once): the
      sign-flip test over them can go no lower than ``2 / 2**distinct``.
  """
  seeds: list
  counts: list[PairCounts]
  halves: dict[str, list[PairCounts]]
  half_size: int
  combined_p: float
  own: list[tuple[int, int]]
  setup: seed_pairs.SetupTest
  distinct: int = 0

  @property
  def examples(self) -> list[int]:
    """The examples each seed pair shares."""
    return [c.total for c in self.counts]

  def models_verdict(self) -> str:
    """The verdict about these trained models: the sign-flip test over digits combined."""
    errors_a, errors_b = (sum(c.errors[side] for c in self.counts) for side in (0, 1))
    return _floored(verdict(self.combined_p, errors_a - errors_b), self.distinct, "shared example")

  def setup_verdict(self) -> str:
    """The verdict about the setup: the exact sign-flip test over seed pairs, with the
    smallest p its number of pairs allows where that keeps it from separating."""
    return _floored(verdict(self.setup.p, self.setup.mean), len(self.seeds), "seed pair")


def _floored(text: str, n: int, units: str) -> str:
  """``text`` with the smallest p that ``n`` units allow where it keeps them from separating."""
  floor = seed_pairs.smallest_p(n)
  if floor < SIGNIFICANCE:
    return text
  return (text[:-1] + f"; {n} {units}{'s' * (n != 1)} cannot go below {p_text(floor)}: "
          f"{seed_pairs.fewest_pairs()} are the fewest that can separate at {SIGNIFICANCE})")


def verdict(p: float, difference: float) -> str:
  """The one wording of a verdict, A against B (``difference``: A's errors minus B's):
  ``A lower (p = 0.011)``, ``B lower (...)``, ``not separated (p = 0.5)``."""
  if p >= SIGNIFICANCE or difference == 0:
    return f"not separated ({p_text(p)})"
  return f"{'A' if difference < 0 else 'B'} lower ({p_text(p)})"


def pair_label(seed_a, seed_b):
  """A seed pair's label: the seed both runs have, or ``"0/1"`` for A's seed 0 and B's 1."""
  return seed_a if seed_a == seed_b else f"{seed_a}/{seed_b}"


def compare(pairs: list[tuple[object, Predictions, Predictions]]) -> Comparison:
  """:class:`Comparison` of ``[(pair label, A's predictions, B's predictions)]``."""
  if not pairs:
    raise UsageError("No pair of runs to compare: the two sides share no seed.")
  counts, halves, own, digests = [], {"first": [], "second": []}, [], {}
  half_size = pairs[0][1].source_size // 2
  rows = []  # Per pair: its shared ids, where A's run is wrong and where B's is.
  for label, a, b in pairs:
    rows_a, rows_b = aligned(a, b, f"the runs of seed pair {label} (A's {len(a)} examples, "
                                   f"B's {len(b)})")
    wrong_a, wrong_b = ~a.correct[rows_a], ~b.correct[rows_b]
    ids = a.id[rows_a]
    for i, digest in zip(ids.tolist(), a.digest[rows_a].tolist()):
      if digests.setdefault(i, digest) != digest:
        raise UsageError(f"The seed pairs do not hold the same examples: id {i} holds other "
                         f"inputs in seed pair {label} than in an earlier pair. Compare runs "
                         "of the same data.")
    counts.append(PairCounts.of(wrong_a, wrong_b))
    first = ids < half_size
    halves["first"].append(PairCounts.of(wrong_a[first], wrong_b[first]))
    halves["second"].append(PairCounts.of(wrong_a[~first], wrong_b[~first]))
    own.append((len(a), len(b)))
    rows.append((ids, wrong_a, wrong_b))
  union = np.unique(np.concatenate([ids for ids, _, _ in rows]))
  wrong_a, wrong_b, evaluated = (np.zeros((len(rows), len(union)), bool) for _ in range(3))
  for k, (ids, a_wrong, b_wrong) in enumerate(rows):
    columns = np.searchsorted(union, ids)
    wrong_a[k, columns], wrong_b[k, columns], evaluated[k, columns] = a_wrong, b_wrong, True
  return Comparison([label for label, _, _ in pairs], counts, halves, half_size,
                    sign_flip_exact((wrong_a.astype(np.int64) - wrong_b).sum(0)), own,
                    seed_pairs.SetupTest.of(wrong_a, wrong_b, evaluated), len(union))


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
  first, second = (sum(c.errors[side] for c in counts[half]) for half in ("first", "second"))
  share = sum(c.total for c in counts["first"]) / max(
      1, sum(c.total for c in counts["first"] + counts["second"]))
  return first, second, binomial_two_sided(first, first + second, share)


def points(fraction: float) -> str:
  """An error difference in percentage points, signed: ``-0.24``."""
  return f"{100 * fraction:+.2f}"


def needed_text(test: seed_pairs.SetupTest) -> str:
  """The seed pairs the difference needs, with what it was computed from."""
  pairs = len(test.differences)
  if test.needed is None:
    return test.needed_why
  rough = f"; from {pairs} seed pairs' spread, a rough estimate" if pairs <= 3 else ""
  return f"about {test.needed} ({test.needed_why}{rough})"


def count_text(values) -> str:
  """``10,000``, or ``120-128`` where seed pairs differ."""
  low, high = min(values), max(values)
  return f"{low:,}" if low == high else f"{low:,}-{high:,}"


def errors_text(counts: list[PairCounts], side: int) -> str:
  """A side's error (%) over the seed pairs' shared examples, mean ± std over the pairs that
  hold any; "no shared example" where none does."""
  values = [100 * c.errors[side] / c.total for c in counts if c.total]
  if not values:
    return "no shared example"
  return spread.mean_pm(*spread.mean_std(values), scale=1.0)


def markdown(result: Comparison, evaluation: str = "test") -> str:
  """The comparison as text: each side's error (%) on all shared examples and on each half,
  per seed pair the discordant counts and McNemar's p, and the two verdicts with the seed
  pairs the difference needs (what the sides are: :mod:`capsjax.stats.sides`)."""
  h = result.half_size
  first, second = result.halves["first"], result.halves["second"]
  lines = [
      f"Error (%) on the {evaluation} examples each seed pair shares, {len(result.seeds)} seed "
      f"pair(s), mean ± std over the pairs; the halves by id in the source's order (MNIST's "
      f"files: [:{h}] and [{h}:]):", "",
      "| examples (per seed pair) | A | B |", "|---|---|---|",
      *(f"| {subset} ({count_text([c.total for c in counts])}) | {errors_text(counts, 0)} | "
        f"{errors_text(counts, 1)} |" for subset, counts in (
            ("all shared", result.counts), (f"ids < {h}", first), (f"ids >= {h}", second))), "",
      "Per seed pair (the seed, or A's/B's): the examples both runs evaluated, each run's "
      "errors on them, the examples only A gets wrong, only B, both; McNemar's exact p (all "
      "shared examples, and each half; - where a half holds none):", "",
      "| seed pair | examples shared | A wrong | B wrong | only A wrong | only B wrong | both "
      "wrong | McNemar p | McNemar p, ids < half | McNemar p, ids >= half |",
      "|---|---|---|---|---|---|---|---|---|---|"]
  for k, (label, c) in enumerate(zip(result.seeds, result.counts)):
    p_first = format_p(first[k].p_value) if first[k].total else "-"
    p_second = format_p(second[k].p_value) if second[k].total else "-"
    lines.append(f"| {label} | {c.total:,} | {c.errors[0]} | {c.errors[1]} | {c.only_a} | "
                 f"{c.only_b} | {c.both} | {format_p(c.p_value)} | {p_first} | {p_second} |")
  lines.append("")
  for side, name in ((0, "A"), (1, "B")):
    n_first, n_second, p = halves_test(result.halves, side)
    test = (f"exact binomial test that an error is as likely in either half: {p_text(p)}"
            if all(c.total for c in first + second) else
            "no test: a half holds none of the shared examples")
    lines.append(f"{name}'s errors in the halves, over its seeds: {n_first} and {n_second} "
                 f"({test}).")
  setup = result.setup
  per_pair = ", ".join(points(d) for d in setup.differences)
  drawn = ("two-level bootstrap over seed pairs and digits" if len(setup.differences) > 1 else
           "bootstrap over digits alone: one seed pair has no spread over training runs")
  lines += [
      "", "The verdicts (capsjax/stats/paired.py and capsjax/stats/seed_pairs.py say why):", "",
      f"- **These trained models** (the {evaluation} digits as the units, the trained runs "
      f"fixed: McNemar's exact test per seed pair above, combined over seed pairs by the exact "
      f"sign-flip test over digits): {result.models_verdict()}.",
      f"- **The setup** (the training runs as the units): A - B = {points(setup.mean)} points "
      f"(per seed pair: {per_pair}), 95% interval [{points(setup.low)}, {points(setup.high)}] "
      f"({drawn}); the exact sign-flip test over the "
      f"{len(setup.differences)} seed pair(s): {result.setup_verdict()}.",
      f"- Seed pairs the setup test needs to separate a difference of this size at this "
      f"spread (80% of the time at p < 0.05): {needed_text(setup)}.", "",
      "A difference of setups is separated only by the setup's verdict.", ""]
  return "\n".join(lines)


ROW_HEADER = ("seed pairs", "examples shared per seed pair (A's own, B's own)", "only A wrong",
              "only B wrong", "McNemar p per seed pair",
              "these trained models: sign-flip over digits",
              "A - B error (points) [95% interval]", "the setup: sign-flip over seed pairs",
              "seed pairs needed")


def row(result: Comparison) -> list[str]:
  """A sweep's paired table's cells (:data:`ROW_HEADER`) for one comparison."""
  own_a, own_b = (count_text([own[side] for own in result.own]) for side in (0, 1))
  setup = result.setup
  return [str(len(result.seeds)), f"{count_text(result.examples)} ({own_a}, {own_b})",
          str(sum(c.only_a for c in result.counts)), str(sum(c.only_b for c in result.counts)),
          ", ".join(format_p(c.p_value) for c in result.counts), result.models_verdict(),
          f"{points(setup.mean)} [{points(setup.low)}, {points(setup.high)}]",
          result.setup_verdict(), needed_text(setup)]


def as_json(result: Comparison) -> dict:
  """The comparison as JSON-able data."""
  counts = lambda cs: [dataclasses.asdict(c) | {"examples": c.total, "p": c.p_value} for c in cs]
  setup = result.setup
  return {"seeds": result.seeds, "examples": result.examples,
          "own_examples": [list(o) for o in result.own], "half_size": result.half_size,
          "pairs": counts(result.counts),
          "halves": {name: counts(cs) for name, cs in result.halves.items()},
          "these_trained_models": {"combined_p": result.combined_p,
                                   "verdict": result.models_verdict()},
          "the_setup": {"differences": setup.differences, "mean": setup.mean,
                        "interval_95": [setup.low, setup.high], "p": setup.p,
                        "smallest_p": setup.floor, "verdict": result.setup_verdict(),
                        "seed_pairs_needed": setup.needed,
                        "seed_pairs_needed_why": setup.needed_why},
          "errors_by_half": {side: dict(zip(("first", "second", "p"),
                                            halves_test(result.halves, k)))
                             for k, side in enumerate("ab")}}
