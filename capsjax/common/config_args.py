"""Config variants as keyword arguments, in the manner of big_vision's ``parse_arg``.

The string after the ``:`` of ``--config=configs/affnist.py:baseline,smoke`` reaches the config
file's ``get_config(arg)``; the file parses it once, against the keywords it accepts and their
defaults, and passes plain Python values on (to a base config's builder, never the string)::

  def get_config(arg=None):
    args = config_args.parse_arg(arg, "configs/affnist.py", baseline=False, smoke=False)
    ...

``"baseline,smoke"`` gives ``baseline=True, smoke=True``; ``"smoke,width=8"`` gives
``width=8`` as well, typed like the default (bool, int, float or str). An unknown keyword or a
value of the wrong type raises ``ValueError`` naming it and the accepted keywords (the command
line reports it and exits with status 2). ``aliases`` keeps older spellings working, e.g.
``{"baseline_smoke": "baseline,smoke"}``.

Imports nothing of JAX: config files are read before the accelerator starts.
"""

from __future__ import annotations

import contextlib

import ml_collections

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _typed(key: str, text: str, default, where: str):
  """``text`` as the type of ``default``."""
  kind = type(default)
  if kind is bool and text.lower() in _TRUE + _FALSE:
    return text.lower() in _TRUE
  if kind is not bool:
    with contextlib.suppress(ValueError):
      return text if kind is str else kind(text)
  raise ValueError(f"{where}: variant keyword {key}={text!r} is not a {kind.__name__} "
                   f"(its default is {default!r}).")


def parse_arg(arg: str | None, where: str, *, aliases: dict[str, str] | None = None,
              **spec) -> ml_collections.ConfigDict:
  """Parses ``arg`` (``"key,key=value,..."``, or None/"" for all defaults) against ``spec``.

  Args:
    arg: the variant string of ``--config=FILE:arg``.
    where: the config file's name, for error messages.
    aliases: whole-item spellings to expand first, e.g. ``{"baseline_smoke": "baseline,smoke"}``.
    **spec: each accepted keyword and its default; the default's type types the value.

  Returns:
    A locked ConfigDict with every keyword of ``spec``.
  """
  aliases = aliases or {}
  args = ml_collections.ConfigDict(dict(spec))
  items = [item.strip() for item in (arg or "").split(",") if item.strip()]
  items = [part for item in items for part in aliases.get(item, item).split(",")]
  for item in items:
    key, has_value, text = item.partition("=")
    key = key.strip()
    if key not in spec:
      accepted = ", ".join(f"{k}={v!r}" for k, v in spec.items()) or "none"
      raise ValueError(f"{where}: unknown variant keyword {key!r} in {arg!r}; accepted "
                       f"(with defaults): {accepted}.")
    default = spec[key]
    if not has_value:
      if type(default) is not bool:
        raise ValueError(f"{where}: variant keyword {key!r} needs a value ({key}=...); its "
                         f"default is {default!r}.")
      args[key] = True
    else:
      args[key] = _typed(key, text.strip(), default, where)
  args.lock()
  return args
