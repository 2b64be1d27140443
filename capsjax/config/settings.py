"""Settings, declared once each, and the one function that resolves them.

Every key a config may hold is declared once, as a :class:`Setting` (its default, meaning, type and
range), in tables ``{key: Setting}`` (keys relative to their section) beside the code that reads
them (which tables: :mod:`capsjax.config.schema`). :func:`resolve` is the one resolver (defaults
filled in, a bad key or value refused in one line naming the key; :func:`read` is it over a
table's own keys of a section): a router's, an optimiser's, an evaluation's and a whole run
config's settings (:func:`capsjax.config.schema.resolve_config`, once per command before anything
is compiled) all come through it; ``python -m capsjax.config.schema`` lists every table
(docs/config_keys.md).

A value that is legal but almost surely a mistake (a negative loss weight, m+ <= m-) is refused too,
unless the config sets ``allow_unusual=True``: such a check is marked ``unusual`` and says so.

JAX-free: config files and the tools that read configs import it without starting JAX.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
from typing import Any, Callable, Mapping

import ml_collections

from capsjax.common.errors import UsageError


class _Required:
  __repr__ = lambda self: "REQUIRED"


REQUIRED: Any = _Required()  # The default of a setting every config sets (the file's value).


@dataclasses.dataclass(frozen=True)
class Check:
  """The values a setting may take: ``test(value) -> bool`` and the words for them
  (``"> 0"``, ``"one of ('VALID', 'SAME')"``). ``unusual``: legal, but almost surely a
  mistake; refused unless ``allow_unusual``."""
  test: Callable[[Any], bool]
  words: str
  unusual: bool = False

  def __str__(self) -> str:
    return self.words


def at_least(low: float) -> Check:
  return Check(lambda v: v >= low, f">= {low!r}")


def above(low: float) -> Check:
  return Check(lambda v: v > low, f"> {low!r}")


def between(low: float, high: float, *, open_low: bool = False, open_high: bool = False) -> Check:
  """``low <= v <= high``, an end open where asked: ``(0, 1]``."""
  def test(v):
    return (v > low if open_low else v >= low) and (v < high if open_high else v <= high)
  return Check(test, f"in {'(' if open_low else '['}{low!r}, {high!r}{')' if open_high else ']'}")


def one_of(*choices) -> Check:
  return Check(lambda v: v in choices, f"one of {choices!r}")


def each(check: Check) -> Check:
  """Every element of a tuple passes ``check``."""
  return Check(lambda v: all(check.test(x) for x in v), f"each {check.words}")


def usually(check: Check) -> Check:
  """``check`` as an unusual-value rule: refused unless ``allow_unusual=True``."""
  return Check(check.test, check.words, unusual=True)


POSITIVE = above(0)
NON_NEGATIVE = at_least(0)


@dataclasses.dataclass(frozen=True)
class Setting:
  """One key a config may hold.

  Attributes:
    default: the value a config that leaves the key out (or sets None) gets;
      :data:`REQUIRED`: every config sets it.
    meaning: what it does, in one line (the listing's words).
    kind: its type (``int``, ``float | None``, ``tuple``, ...); None: the default's. A float
      setting takes an int; a tuple one a list.
    check: the values it may take beyond its type (:class:`Check`).
    neutral: a resumed run may change it without changing what it computes (how often it
      logs, where its files are; ``capsjax.config.history``).
    init_only: read only to draw the initial parameters (runs that differ in it may share one
      vectorised program: ``capsjax.training.vectorize``).
  """
  default: Any = REQUIRED
  meaning: str = ""
  kind: Any = None
  check: Check | None = None
  neutral: bool = False
  init_only: bool = False

  @property
  def required(self) -> bool:
    return self.default is REQUIRED

  @property
  def type(self) -> Any:
    """The type a value must have: :attr:`kind`, else the default's (None: any)."""
    if self.kind is not None:
      return self.kind
    if self.required or self.default is None:
      return None
    return type(self.default)

  def type_words(self) -> str:
    kind = self.type
    if kind is None:
      return "any"
    if isinstance(kind, type):
      return kind.__name__
    return str(kind).replace("NoneType", "None")


@dataclasses.dataclass(frozen=True)
class Rule:
  """A rule between settings, declared with them: ``test(*values of keys) -> bool`` and the
  words for it (``"m+ > m-"``); ``unusual``: legal but almost surely a mistake (refused unless
  ``allow_unusual``)."""
  keys: tuple[str, ...]
  test: Callable[..., bool]
  words: str
  unusual: bool = False


def check_rules(rules, values: Mapping[str, Any], allow_unusual: bool = False) -> None:
  """UsageError naming the keys and values of the first rule that ``values`` (resolved, flat,
  full keys) break; a rule whose keys are not all there is not checked."""
  for rule in rules:
    if rule.unusual and allow_unusual or any(k not in values for k in rule.keys):
      continue
    if not rule.test(*(values[k] for k in rule.keys)):
      given = ", ".join(f"config.{k}={values[k]!r}" for k in rule.keys)
      unusual = (" This is legal but almost surely a mistake: set --config.allow_unusual=True "
                 "to run it anyway.") if rule.unusual else ""
      raise UsageError(f"{given}: they must satisfy {rule.words}.{unusual}")


def declared(table: Mapping[str, Any]) -> dict[str, Setting]:
  """``table`` with plain defaults as :class:`Setting` (a researcher's router or evaluator may
  declare ``{"key": default}``)."""
  return {key: value if isinstance(value, Setting) else Setting(value)
          for key, value in table.items()}


def _accepts(kind, value) -> bool:
  """Whether ``value`` is of ``kind`` (bools are not numbers; an int is a float)."""
  kinds = kind.__args__ if isinstance(kind, types.UnionType) else (kind,)
  number = not isinstance(value, bool)
  return any((k is type(None) and value is None)
             or (k is float and isinstance(value, (int, float)) and number)
             or (k is int and isinstance(value, int) and number)
             or (k is tuple and isinstance(value, (tuple, list)))
             or (k is dict and callable(getattr(value, "items", None)))  # A dict or a ConfigDict.
             or (k not in (float, int, tuple, type(None)) and isinstance(value, k))
             for k in kinds)


def _coerced(kind, value):
  """``value`` as ``kind`` holds it: an int given for a float as a float, a list as a tuple."""
  kinds = kind.__args__ if isinstance(kind, types.UnionType) else (kind,)
  if isinstance(value, list) and tuple in kinds:
    return tuple(value)
  if (float in kinds and int not in kinds and isinstance(value, int)
      and not isinstance(value, bool)):
    return float(value)
  return value


def nearest(key: str, known) -> str | None:
  """The declared key closest in spelling to ``key`` (or one that ends the same way)."""
  known = list(known)
  last = key.rsplit(".", 1)[-1]
  close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
  if close:
    return close[0]
  same_end = [k for k in known if k.rsplit(".", 1)[-1] == last]
  return same_end[0] if same_end else None


def _a(words: str) -> str:
  """``words`` with its article, ``|`` read as "or": "an int", "a float or None"."""
  words = words.replace(" | ", " or ")
  return ("an " if words[:1] in "aeiou" else "a ") + words


def check_value(where: str, setting: Setting, value, allow_unusual: bool = False):
  """``value`` of the setting at ``where`` (``"config.data.test_limit"``), typed as
  declared; UsageError naming the key, the type or range and the value otherwise."""
  if value is None:
    if setting.required:
      raise UsageError(f"{where} is not set; every config sets it ({setting.meaning}), as "
                       f"{_a(setting.type_words())}.")
    return setting.default
  kind = setting.type
  if kind is not None:
    if not _accepts(kind, value):
      raise UsageError(f"{where}={value!r} is {_a(type(value).__name__)}; it must be "
                       f"{_a(setting.type_words())} ({setting.meaning}).")
    value = _coerced(kind, value)
  check = setting.check
  if check is not None and not (check.unusual and allow_unusual):
    try:
      ok = check.test(value)
    except TypeError:
      ok = False
    if not ok:
      unusual = (" This value is legal but almost surely a mistake: set "
                 "--config.allow_unusual=True to run it anyway.") if check.unusual else ""
      raise UsageError(f"{where}={value!r} is out of range: it must be {check} "
                       f"({setting.meaning}).{unusual}")
  return value


def resolve(values: Mapping[str, Any], table: Mapping[str, Any], where: str, *,
            owner: str = "", elsewhere: Mapping[str, str] | None = None,
            allow_unusual: bool = False, owner_of: Callable[[str], str] | None = None,
            unchecked: tuple[str, ...] = ()) -> dict[str, Any]:
  """The settings of one section in effect: every key of ``table`` (``{key: Setting}``, keys
  relative to the section ``where``, e.g. ``"config.model.routing"``) with its value in
  ``values`` (flat, the same relative keys) or its default.

  Raises UsageError, one line naming the key: for a key of ``values`` that ``table`` does not
  declare (with the nearest declared key; ``elsewhere`` maps keys that other choices declare
  to their owner, e.g. another router's setting, which may be present only unset); for a
  required key left unset; for a value of the wrong type or out of range (:func:`check_value`).
  ``owner`` names the table in messages (``"router 'dynamic'"``); ``owner_of(key)``, where
  given, names the owner of each key instead (a whole config's: ``"model 'capsnet'"``), and
  the message then lists no settings. Keys that start with one of ``unchecked`` (a section
  whose class declares no settings) are taken as given, unchecked.
  """
  table = declared(table)
  elsewhere = elsewhere or {}
  given = {}
  for key, value in values.items():
    if key in table:
      continue
    if unchecked and key.startswith(unchecked):
      given[key] = value
      continue
    if key in elsewhere:
      if value is None:
        continue
      raise UsageError(f"{where}.{key}={value!r} is not a setting of {owner or where} (it is "
                       f"{elsewhere[key]}'s); leave it unset, or choose that one.")
    close = nearest(key, table)
    hint = f"; did you mean {where}.{close}?" if close else ""
    if owner_of is not None:
      raise UsageError(f"{where}.{key} is not a setting of {owner_of(key)}{hint}")
    raise UsageError(f"{where}.{key} is not a setting of {owner or where}{hint} (its "
                     f"settings: {', '.join(sorted(table)) or 'none'}).")
  return {**{key: check_value(f"{where}.{key}", setting, values.get(key), allow_unusual)
             for key, setting in table.items()}, **given}


def in_effect(section) -> bool:
  """Whether ``section`` is part of a resolved config (frozen:
  :class:`capsjax.config.schema.ResolvedConfig`), so that it holds every setting in effect
  already and is read as it is, never resolved again."""
  return isinstance(section, ml_collections.FrozenConfigDict)


def read(section, table: Mapping[str, Any], where: str, allow_unusual: bool = False
         ) -> dict[str, Any]:
  """The settings of ``table`` (keys relative to ``section``, e.g. ``"shift_pixels"``) in effect
  in ``section`` (a config node, or None: absent), as :func:`resolve` gives them (a section
  :func:`in_effect`: as it holds them); other keys of ``section`` are not this table's business
  (a dataset's ``config.data`` holds those of its sources too), so they are not looked at."""
  if in_effect(section):
    return {key: section[key] for key in declared(table)}
  values = {key: None if section is None else section.get(key) for key in declared(table)}
  return resolve(values, table, where, allow_unusual=allow_unusual)


def flatten(tree: Mapping, prefix: str = "", stop: Callable[[str], bool] = lambda k: False
            ) -> dict[str, Any]:
  """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (a ConfigDict or nested dicts); a key for which
  ``stop(key)`` holds keeps its value whole (a setting whose value is a dict); an empty section
  gives no key."""
  flat = {}
  for key, value in tree.items():
    dotted = f"{prefix}{key}"
    if hasattr(value, "items") and callable(value.items) and not stop(dotted):  # ConfigDicts too.
      flat.update(flatten(dict(value.items()), dotted + ".", stop))
    else:
      flat[dotted] = value
  return flat


def prefixed(prefix: str, table: Mapping[str, Any]) -> dict[str, Setting]:
  """``table``'s keys under ``prefix`` (``"model"``: ``"conv1.features"`` ->
  ``"model.conv1.features"``)."""
  return {f"{prefix}.{key}" if prefix else key: s for key, s in declared(table).items()}


def value_words(setting: Setting) -> str:
  """The default as the listing shows it."""
  if setting.required:
    return "required"
  return "unset" if setting.default is None else repr(setting.default)


def markdown_rows(table: Mapping[str, Any], prefix: str = "") -> list[str]:
  """``| key | default | type, range | meaning |`` rows of ``table`` (``|`` escaped)."""
  cell = lambda text: str(text).replace("|", "\\|")
  rows = []
  for key, s in declared(table).items():
    kind = s.type_words() + (f", {s.check}" if s.check else "")
    if s.check is not None and s.check.unusual:
      kind += " (else allow_unusual)"
    rows.append(f"| `{prefix}{key}` | `{cell(value_words(s))}` | {cell(kind)} | "
                f"{cell(s.meaning)} |")
  return rows
