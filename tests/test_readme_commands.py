"""Every command in the READMEs' shell blocks pastes and runs: the capsjax invocations parse.

Each `python -m capsjax.X ...` and `python experiments/X.py ...` line (with its `\\`
continuations) of a ```bash block in README.md, experiments/README.md and docs/*.md is checked
without
running it: no optional-part brackets or `...` placeholders a shell would choke on, every flag
defined by that command, every `--config=FILE[:VARIANT]` a config file with that variant, and
every `--config.KEY=...` override a key of that config (for a sweep, of its experiment's
BASE_CONFIG).
"""

import functools
import importlib
import json
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from capsjax.config import runconfig

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = ("README.md", "experiments/README.md",
        *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md")))


def shell_commands(text: str) -> list[str]:
  """The lines of the ```bash blocks of a markdown text, continuations joined and the block's
  own variables (``D="--config..."``) expanded."""
  commands = []
  for block in re.findall(r"```bash\n(.*?)```", text, re.S):
    variables, current = {}, ""
    for line in block.splitlines():
      if line.rstrip().endswith("\\"):
        current += line.rstrip()[:-1] + " "
        continue
      line, current = current + line, ""
      assignment = re.fullmatch(r"\s*([A-Za-z_]\w*)=(.*)", line)
      if assignment:
        variables[assignment[1]] = " ".join(shlex.split(assignment[2]))
        continue
      for name, value in variables.items():
        line = re.sub(rf"\$({name}\b|{{{name}}})", value, line)
      commands.append(line.strip())
  return [c for c in commands if c]


def capsjax_invocations(doc: str) -> list[tuple[str, list[str]]]:
  """``(target, arguments)`` of each capsjax command of ``doc``: target is ``capsjax.X`` or
  an ``experiments/*.py`` script."""
  found = []
  for command in shell_commands((REPO / doc).read_text()):
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split, lexer.commenters = True, "#"
    words = list(lexer)
    for i, word in enumerate(words):
      if word != "python" or i + 1 >= len(words):
        continue
      rest = words[i + 1:]
      for end, w in enumerate(rest):  # The command ends at a shell operator.
        if w in (";", "&", "&&", "|", "||"):
          rest = rest[:end]
          break
      if rest[0] == "-m" and rest[1].startswith("capsjax."):
        found.append((rest[1], rest[2:]))
      elif rest[0].startswith("experiments/") and rest[0].endswith(".py"):
        found.append((rest[0], rest[1:]))
  return found


ALL = [(doc, target, args) for doc in DOCS for target, args in capsjax_invocations(doc)]


@functools.cache
def defined_flags(target: str) -> frozenset[str]:
  """The absl flags a command defines: a capsjax command's ``define_flags`` in a FlagValues of
  its own; a script imported in a fresh process (scripts define theirs at import)."""
  if target.startswith("capsjax."):
    from absl import flags as absl_flags

    flag_values = absl_flags.FlagValues()
    importlib.import_module(target).define_flags(flag_values, [target, "--helpshort"])
    return frozenset(flag_values)
  load = f"import runpy; runpy.run_path({str(REPO / target)!r}, run_name='readme_check')"
  out = subprocess.run(
      [sys.executable, "-c", f"{load}; from absl import flags; import json; "
                             "print(json.dumps(sorted(flags.FLAGS)))"],
      capture_output=True, text=True, cwd=REPO, check=True).stdout
  return frozenset(json.loads(out.splitlines()[-1]))


def config_has_key(config, dotted: str) -> bool:
  """Whether ``dotted`` is a key of ``config`` or one a config of its dataset and model may set
  (declared beside the code that reads it: the file may leave it out at its default)."""
  from capsjax import sweep
  from capsjax.common.errors import UsageError
  from capsjax.config import schema

  node = config
  for part in dotted.split("."):
    if not hasattr(node, "keys") or part not in node.keys():
      break
    node = node[part]
  else:
    return True
  try:
    schema.resolve_config(sweep.apply_overrides(config, {dotted: None}))
  except UsageError as e:
    return "is not a setting" not in str(e)
  return True


def test_the_readmes_have_capsjax_commands():
  targets = {target for _, target, _ in ALL}
  assert {"capsjax.main", "capsjax.evaluate", "capsjax.sweep", "capsjax.benchmark",
          "capsjax.compare"} <= targets
  assert len(ALL) > 30


@pytest.mark.parametrize("doc,target,args", ALL,
                         ids=[f"{d}:{t}:{i}" for i, (d, t, _) in enumerate(ALL)])
def test_command_parses(doc, target, args):
  line = " ".join([target, *args])
  for word in args:  # What bash would run or choke on: [optional] parts, ... placeholders.
    assert not re.search(r"[\[\]|]|^\.\.\.$", word), f"{doc}: `{word}` in `{line}`"
  flags = defined_flags(target)
  config_file, overrides, positional = None, [], []
  for word in args:
    if not word.startswith("-"):
      positional.append(word)
      continue
    name, _, value = word.lstrip("-").partition("=")
    if name.startswith("config."):
      overrides.append(name[len("config."):])
      continue
    if "." in name and name.split(".")[0] in flags:  # A key of another config-file flag.
      continue
    assert name in flags or (name.startswith("no") and name[2:] in flags), (
        f"{doc}: {target} has no flag --{name} (`{line}`)")
    if name == "config":
      config_file = value
  if target == "capsjax.sweep":
    assert len(positional) == 1, f"{doc}: `{line}` names no single experiment file"
    experiment = REPO / positional[0].partition(":")[0]  # EXPERIMENT.py[:variant]
    assert experiment.exists(), f"{doc}: {positional[0]} does not exist"
    config_file = config_file or runconfig.import_config_file(experiment).BASE_CONFIG
  elif target == "capsjax.compare":  # Two sides: runs, sweeps or SWEEP_DIR:SETTING.
    assert len(positional) == 2, f"{doc}: `{line}` names not two sides"
  else:
    assert not positional, f"{doc}: unexpected arguments {positional} in `{line}`"
  if config_file is None:
    assert not overrides, f"{doc}: --config.* without --config in `{line}`"
    return
  path, _, variant = config_file.partition(":")
  assert (REPO / path).exists(), f"{doc}: {path} does not exist (`{line}`)"
  config = runconfig.import_config_file(REPO / path).get_config(variant or None)
  for key in overrides:
    assert config_has_key(config, key), f"{doc}: {path} has no key {key} (`{line}`)"


@pytest.mark.parametrize("args", [
    ["--config=configs/multimnist.py[:baseline]", "--workdir=/tmp/w"],  # Seen in the README.
    ["--config=configs/mnist.py:nope", "--workdir=/tmp/w"],
    ["--config=configs/nope.py", "--workdir=/tmp/w"],
    ["--config=configs/mnist.py", "--workdir=/tmp/w", "--config.num_steps=5"],
    ["--config=configs/mnist.py", "--workdir=/tmp/w", "--epochs=5"],
    ["--config=configs/mnist.py", "--workdir=/tmp/w", "..."],
])
def test_the_check_catches_what_would_not_run(args):
  with pytest.raises((AssertionError, ValueError)):
    test_command_parses("README.md", "capsjax.main", args)


def test_commands_are_read_as_bash_reads_them():
  text = ('```bash\nD="--config.data.source=idx --config.data.dir=/m"\n'
          'python -m capsjax.main --config=configs/mnist.py \\\n    --workdir=/w $D & done; wait\n'
          '```\n')
  (command,) = shell_commands(text)
  assert command.startswith("python -m capsjax.main --config=configs/mnist.py")
  assert "--config.data.dir=/m" in command


def test_every_doc_page_is_reachable_from_the_readme():
  readme = (REPO / "README.md").read_text()
  for doc in DOCS[2:]:
    if doc.count("/") == 1:  # docs/NAME.md; docs/notes/ is reached from the pages.
      assert f"({doc})" in readme, f"README.md links no {doc}"
  assert len(readme.splitlines()) <= 150  # A front page; the rest lives in docs/.


def test_the_readmes_first_screen_sets_up_and_runs():
  """The README's first 40 lines, before its results, hold the two set-up commands a fresh
  machine needs and a command that trains something."""
  readme = (REPO / "README.md").read_text()
  first_screen = "\n".join(readme.splitlines()[:40]).split("\n## ")[0]
  commands = [c.split(" #")[0].strip() for c in shell_commands(first_screen)]
  assert commands[:2] == ['pip install -e ".[dev]"', "python -m pytest -q"], commands
  assert any(c.startswith("python -m capsjax.main ") for c in commands[2:]), commands


# Every relative link, anchor and section reference: tests/test_doc_links.py.


def test_no_file_points_at_the_development_machines_data():
  """Commands a user reads say /path/to/mnist: the shared data folder beside the checkout
  exists on capsjax's own machines only (one test reads it there and skips elsewhere)."""
  allowed = {"tests/test_datasets_sources.py"}
  needle = "/".join(("..", "shared"))  # Spelt so that this file does not hold it.
  skip = {".git", "__pycache__", ".pytest_cache", "build", "dist"}
  found = []
  for path in REPO.rglob("*"):
    parts = path.relative_to(REPO).parts
    if (not path.is_file() or set(parts) & skip or parts[0].startswith(".")
        or any(p.endswith(".egg-info") for p in parts) or path.suffix not in (
            ".py", ".md", ".sh", ".toml", ".txt", ".cfg", ".ipynb", "")):
      continue
    if needle in path.read_text(errors="ignore"):
      found.append(str(path.relative_to(REPO)))
  assert sorted(set(found) - allowed) == []
