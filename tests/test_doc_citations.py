"""The docs cite capsjax's code by file and name, never by line (line numbers drift with every
edit; a stale one sends a reader to unrelated code).

A citation is a path of capsjax's own code in backticks, a space and a dotted name in
backticks: `` `capsjax/models/losses.py` `margin_loss_per_example` ``. The name must resolve in
that file, read with ``ast`` (:func:`resolve`):

- a module-level function, class or assignment (``OFFICIAL_CODE``);
- then, part by part, a class's method, class attribute, dataclass field or ``self.x``
  assignment (``PrimaryCapsules.__call__``, ``LossSettings.margin_weight``), a function's
  nested function or class (``procedure_1.s_of``), or a key of a dict an assignment holds
  (``OPTIMIZERS.adam.eps_hat``, from ``{...}``, ``dict(...)`` or ``ConfigDict(dict(...))``);
- in a config file (``configs/``, ``experiments/``) also a config key the file assigns,
  matched by its last parts: ``model.conv1`` for ``c.model.conv1 = ...`` or ``model.conv1 =
  ...``, ``model.primary.bias_init`` for ``model.primary = ConfigDict(dict(bias_init=0.0))``.

Names after it, each ``, `name` `` (``PrimaryCapsules.__call__`, `output_scale```), point
inside the cited code: each must be a name its code uses (a variable, attribute, argument,
keyword or string; comments and docstrings left out; a dotted one as an attribute chain).

Official code (Sarasra/models ``research/capsules`` at a pinned commit) keeps ``file:line``:
``models/layers/layers.py:357-362``, ``layers.py:113``, ``:396``."""

import ast
import dataclasses
import functools
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
ROOTS = ("capsjax", "configs", "experiments", "tools", "examples", "tests")
CONFIG_ROOTS = ("configs", "experiments")
PAGES = sorted(
    p for p in REPO.rglob("*.md")
    if not any(part.startswith(".") or part in {"build", "dist", "node_modules"}
               for part in p.relative_to(REPO).parts))
PAPER = REPO / "docs" / "paper_experiments.md"

NAME = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
CITATION = re.compile(rf"`((?:{'|'.join(ROOTS)})/[\w/]+\.py)`\s+`({NAME})`((?:,\s+`{NAME}`)*)")
# A path ending in ``.py`` (any folders, ``../`` included), with a line (``:12``, ``#L12``).
PY_PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.py)(?::(\d+)|#L(\d+))?")
BARE_LINE = re.compile(r"`:(\d+)")
RULES = ("a module-level name, then a class's or function's member, a dict key, or in configs/ "
         "and experiments/ a config key the file assigns")


@dataclasses.dataclass(frozen=True)
class Citation:
  page: str
  path: str
  name: str
  inside: tuple[str, ...]  # The names after it, in its code.

  def __str__(self):
    return f"{self.page}: `{self.path}` `{self.name}`" + "".join(
        f", `{n}`" for n in self.inside)


def citations(text: str, page: str = "<text>") -> list[Citation]:
  found = []
  for match in CITATION.finditer(text):
    inside = tuple(re.findall(r"`([^`]+)`", match.group(3)))
    found.append(Citation(page, match.group(1), match.group(2), inside))
  return found


def page_citations() -> list[Citation]:
  return [c for page in PAGES
          for c in citations(page.read_text(), str(page.relative_to(REPO)))]


# --- Resolving a name in a file. ---

def _dict_items(node: ast.AST) -> dict[str, list[ast.AST]] | None:
  """The keys of the dict ``node`` builds (``{...}``, ``dict(...)``, or a call wrapping one,
  ``ConfigDict(dict(...))``) and their values, or None."""
  if isinstance(node, ast.Dict):
    return {k.value: [v] for k, v in zip(node.keys, node.values)
            if isinstance(k, ast.Constant) and isinstance(k.value, str)}
  if isinstance(node, ast.Call):
    if isinstance(node.func, ast.Name) and node.func.id == "dict":
      items = (_dict_items(node.args[0]) or {}) if node.args else {}
      for keyword in node.keywords:
        if keyword.arg:
          items.setdefault(keyword.arg, []).append(keyword.value)
      return items
    if node.args:
      return _dict_items(node.args[0])
  return None


def _statements(body: list[ast.stmt]):
  """The statements of a scope, into its ``if``/``try``/``with``/``for`` blocks (the same
  scope), not into nested functions or classes."""
  for stmt in body:
    yield stmt
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      continue
    for field in ("body", "orelse", "finalbody"):
      yield from _statements(getattr(stmt, field, []))
    for handler in getattr(stmt, "handlers", []):
      yield from _statements(handler.body)


def _targets(stmt: ast.stmt) -> list[ast.expr]:
  if isinstance(stmt, ast.Assign):
    return [t for target in stmt.targets
            for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
  if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
    return [stmt.target]
  return []


def _members(node: ast.AST) -> dict[str, list[ast.AST]]:
  """``{name: [its definitions]}`` one level inside ``node``: a module's defs, classes and
  assignments; a class's too, and its methods' ``self.x = ...``; a function's nested defs and
  classes (not its local variables); the keys of the dict an assignment (or a key) holds."""
  members: dict[str, list[ast.AST]] = {}
  add = lambda name, what: members.setdefault(name, []).append(what)
  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
    for stmt in _statements(node.body):
      if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        add(stmt.name, stmt)
      for target in _targets(stmt):
        if isinstance(target, ast.Name) and isinstance(node, (ast.Module, ast.ClassDef)):
          add(target.id, stmt)
    if isinstance(node, ast.ClassDef):
      for method in node.body:
        if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
          for stmt in ast.walk(method):
            for target in _targets(stmt):
              if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                  and target.value.id == "self"):
                add(target.attr, stmt)
  else:
    value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) else node
    for key, values in ((_dict_items(value) if value is not None else None) or {}).items():
      for v in values:
        add(key, v)
  return members


def _chain(node: ast.expr) -> list[str] | None:
  """``["c", "model", "conv1"]`` for ``c.model.conv1`` (``c["model"]`` too), else None."""
  if isinstance(node, ast.Name):
    return [node.id]
  if isinstance(node, ast.Attribute):
    inner = _chain(node.value)
    return inner and inner + [node.attr]
  if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
      and isinstance(node.slice.value, str)):
    inner = _chain(node.value)
    return inner and inner + [node.slice.value]
  return None


def _config_keys(tree: ast.Module) -> list[tuple[list[str], ast.AST]]:
  """Each assigned attribute chain of a config file and its value; a dict value adds a chain
  per key (``model.primary.bias_init`` for ``model.primary = ConfigDict(dict(bias_init=0))``)."""
  keys = []

  def add(chain, value):
    keys.append((chain, value))
    for key, values in (_dict_items(value) or {}).items():
      for v in values:
        add(chain + [key], v)

  for stmt in ast.walk(tree):
    for target in _targets(stmt):
      chain = _chain(target)
      if chain and stmt.value is not None:
        add(chain, stmt.value)
  for stmt in ast.walk(tree):  # ``model.update(x=...)`` assigns ``model.x``.
    if (isinstance(stmt, ast.Call) and isinstance(stmt.func, ast.Attribute)
        and stmt.func.attr == "update" and _chain(stmt.func.value)):
      for keyword in stmt.keywords:
        if keyword.arg:
          add(_chain(stmt.func.value) + [keyword.arg], keyword.value)
  return keys


@functools.cache
def parsed(path: str) -> ast.Module:
  return ast.parse((REPO / path).read_text(), filename=path)


def resolve(path: str, name: str) -> list[ast.AST]:
  """The definitions ``name`` names in ``path`` (the module docstring's rules); [] if none."""
  tree = parsed(path)
  nodes: list[ast.AST] = [tree]
  for part in name.split("."):
    nodes = [found for node in nodes for found in _members(node).get(part, [])]
  if nodes or not path.startswith(tuple(f"{root}/" for root in CONFIG_ROOTS)):
    return nodes
  parts = name.split(".")
  return [value for chain, value in _config_keys(tree) if chain[-len(parts):] == parts]


def names_used(nodes: list[ast.AST]) -> set[str]:
  """The names the code of ``nodes`` uses: variables, attributes (and attribute chains, dotted),
  arguments, keywords, string values and dict keys; not comments or docstrings."""
  used = set()
  for node in nodes:
    docstrings = {id(n.value) for n in ast.walk(node) if isinstance(n, ast.Expr)
                  and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
    for child in ast.walk(node):
      if isinstance(child, ast.Name):
        used.add(child.id)
      elif isinstance(child, ast.Attribute):
        used.add(child.attr)
        chain = _chain(child)
        for k in range(len(chain or []) - 1):
          used.add(".".join(chain[k:]))
      elif isinstance(child, ast.arg):
        used.add(child.arg)
      elif isinstance(child, ast.keyword) and child.arg:
        used.add(child.arg)
      elif (isinstance(child, ast.Constant) and isinstance(child.value, str)
            and id(child) not in docstrings):
        used.add(child.value)
      elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        used.add(child.name)
  return used


def problem(citation: Citation) -> str | None:
  """Why ``citation`` does not hold, or None."""
  if not (REPO / citation.path).is_file():
    return f"{citation}: no file {citation.path}"
  nodes = resolve(citation.path, citation.name)
  if not nodes:
    return f"{citation}: {citation.name!r} is not defined in {citation.path} ({RULES})"
  used = names_used(nodes)
  missing = [n for n in citation.inside if n not in used]
  if missing:
    return f"{citation}: {citation.name}'s code does not use {', '.join(map(repr, missing))}"
  return None


# --- Line numbers of capsjax's code. ---

def units(text: str) -> list[str]:
  """A page's table cells and paragraphs: what a bare ``:N`` continues within."""
  found, paragraph = [], []
  for line in text.splitlines() + [""]:
    if line.lstrip().startswith("|"):
      found.extend(re.split(r"(?<!\\)\|", line.strip())[1:-1])
    elif line.strip():
      paragraph.append(line)
      continue
    if paragraph:
      found.append("\n".join(paragraph))
      paragraph = []
  return found


def _root(path: str) -> str:
  parts = [p for p in path.split("/") if p not in (".", "..")]
  return parts[0] if len(parts) > 1 else ""


def capsjax_line_numbers(unit: str) -> list[str]:
  """Each ``file:line`` (or ``#L``) of capsjax's code in ``unit``: a path under one of
  :data:`ROOTS`; a bare ``name.py:N`` after one in the same folder that holds ``name.py``; a
  bare ``:N`` after either. Bare names after an official path, or first, are official."""
  found, last = [], None  # last: the path a bare ``:N`` continues, or None if official.
  events = [(m.start(), "path", m) for m in PY_PATH.finditer(unit)]
  events += [(m.start(), "bare", m) for m in BARE_LINE.finditer(unit)]
  for _, kind, match in sorted(events, key=lambda e: e[0]):
    if kind == "bare":
      if last:
        found.append(f"{last}, then `:{match.group(1)}`")
      continue
    path, line = match.group(1), match.group(2) or match.group(3)
    if "/" in path:
      last = path if _root(path) in ROOTS else None
    elif last and (REPO / pathlib.PurePosixPath(last).with_name(path)).is_file():
      last = str(pathlib.PurePosixPath(last).with_name(path))
    else:
      last = None
    if last and line:
      found.append(match.group(0))
  return found


# --- The tests. ---

def test_the_pages_cite_capsjax_by_name():
  cited = page_citations()
  assert len(cited) >= 30
  problems = [p for c in cited if (p := problem(c))]
  assert not problems, "\n".join(problems)


def page_line_numbers(text: str) -> list[str]:
  return [ref for unit in units(text) for ref in capsjax_line_numbers(unit)]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_no_page_cites_a_line_of_capsjax(page):
  lines = page_line_numbers(page.read_text())
  assert not lines, (f"{page.relative_to(REPO)} cites capsjax's code by line (cite "
                     f"`path` `name` instead): {lines}")


def test_no_comment_or_docstring_cites_a_line_of_capsjax():
  pattern = re.compile(rf"(?<![\w/.-])(?:{'|'.join(ROOTS)})/[\w/]+\.py(?::\d+|#L\d+)")
  found = [f"{path.relative_to(REPO)}: {m.group(0)}"
           for root in ("capsjax", "configs") for path in sorted((REPO / root).rglob("*.py"))
           for m in pattern.finditer(path.read_text())]
  assert not found


def differences_rows() -> list[list[str]]:
  """The cells of each row of the table under "Table 1 as the authors' code ran it"."""
  text = PAPER.read_text()
  section = text[text.index("## Table 1 as the authors' code ran it"):]
  section = section[:section.index("\n## ", 1)]
  rows = [line for line in section.splitlines() if line.startswith("| ")]
  return [re.split(r"(?<!\\)\|", row)[1:-1] for row in rows[1:]]  # Past the header.


def test_the_differences_table_says_where_capsjax_does_each():
  """Each row but one cites where capsjax does what the paper's text says (its 4th column)."""
  rows = differences_rows()
  assert len(rows) >= 14
  assert sum(bool(citations(cells[3])) for cells in rows) >= len(rows) - 1


# --- The checks catch what they are for. ---

SOURCE = '''"""A module docstring naming ghost."""
import dataclasses
import ml_collections

OPTIMIZERS = {"adam": {"eps_hat": False}}


@dataclasses.dataclass
class Settings:
  weight: float = 1.0


class Layer:
  scale = 2

  def __init__(self, output_scale):
    """A docstring naming phantom."""
    self.output_scale = output_scale  # A comment naming spectre.

  def __call__(self, x):
    return x * self.output_scale


def outer(bias):
  def inner(s):
    return s + bias
  return inner


def model_config():
  model = ml_collections.ConfigDict()
  model.conv1 = ml_collections.ConfigDict(dict(features=256, bias_init=0.0))
  return model
'''


@pytest.fixture
def tree(tmp_path, monkeypatch):
  for root in ("capsjax", "configs"):
    (tmp_path / root).mkdir()
    (tmp_path / root / "x.py").write_text(SOURCE)
  monkeypatch.setattr(__import__(__name__), "REPO", tmp_path)
  parsed.cache_clear()
  yield tmp_path
  parsed.cache_clear()


@pytest.mark.parametrize("name", [
    "OPTIMIZERS", "OPTIMIZERS.adam.eps_hat", "Settings.weight", "Layer.scale",
    "Layer.__call__", "Layer.output_scale", "outer.inner", "model_config"])
def test_resolve_finds_each_kind_of_name(tree, name):
  assert resolve("capsjax/x.py", name)


@pytest.mark.parametrize("name", [
    "ghost", "OPTIMIZERS.sgd", "Settings.height", "Layer.forward", "outer.bias.x",
    "model.conv1", "Layer.__call__.x"])
def test_resolve_refuses_what_is_not_defined(tree, name):
  assert not resolve("capsjax/x.py", name)


def test_config_files_resolve_the_keys_they_assign(tree):
  for name in ("model.conv1", "conv1", "model.conv1.bias_init"):
    assert resolve("configs/x.py", name), name
  assert not resolve("configs/x.py", "model.conv2")
  assert not resolve("configs/x.py", "model.conv1.stride")


def test_a_citation_with_a_wrong_name_fails(tree):
  line = ("| PrimaryCaps' coupling | ... | `capsjax/x.py` `Layer.__call__`, `output_scale`, 1 "
          "| bias 0 (`configs/x.py` `model.conv1.bias_init`) |")
  assert [problem(c) for c in citations(line)] == [None, None]
  wrong = line.replace("Layer.__call__", "Layer.forward").replace("bias_init", "bias")
  assert [problem(c) for c in citations(wrong)] == [
      "<text>: `capsjax/x.py` `Layer.forward`, `output_scale`: 'Layer.forward' is not defined "
      f"in capsjax/x.py ({RULES})",
      f"<text>: `configs/x.py` `model.conv1.bias`: 'model.conv1.bias' is not defined in "
      f"configs/x.py ({RULES})"]


def test_a_renamed_symbol_fails_its_citation(tree):
  cited, = citations("`capsjax/x.py` `outer.inner`, `bias`")
  assert problem(cited) is None
  (tree / "capsjax" / "x.py").write_text(SOURCE.replace("def inner", "def nested"))
  parsed.cache_clear()
  assert "'outer.inner' is not defined" in problem(cited)


def test_names_inside_are_code_not_comments_or_docstrings(tree):
  cite = lambda name, inside: problem(Citation("<text>", "capsjax/x.py", name, inside))
  assert cite("Layer", ("output_scale", "self.output_scale", "x")) is None
  for word in ("phantom", "spectre", "ghost", "output"):
    assert cite("Layer", (word,)) == (
        f"<text>: `capsjax/x.py` `Layer`, `{word}`: Layer's code does not use {word!r}")
  assert cite("model_config", ("model.conv1", "features")) is None


@pytest.mark.parametrize("unit,found", [
    ("(`capsjax/models/losses.py:29`, `per_class`)", ["capsjax/models/losses.py:29"]),
    ("[x](../configs/mnist.py#L40)", ["../configs/mnist.py#L40"]),
    ("`capsjax/datasets/augment.py` `epoch_permutation`, `augment.py:45`",
     ["augment.py:45"]),
    ("`capsjax/models/baseline_cnn.py` `BaselineCNN`; `:90`, `bias_init`",
     ["capsjax/models/baseline_cnn.py, then `:90`"]),
    # The official code's: a path outside capsjax's folders, or a bare name first.
    ("(`models/layers/layers.py:357-362`, `:396`)", []),
    ("`layers.py:319`, `:113`; `variables.py:67`", []),
    ("`capsjax/models/capsule_layers.py` `ClassCapsules`; the code's `experiment.py:55`, `:184`",
     []),
    ("`configs/mnist.py:text`, `configs/mnist_baseline.py:official`", []),
])
def test_line_numbers_of_capsjax_are_found(unit, found):
  assert capsjax_line_numbers(unit) == found


def test_a_page_with_a_line_number_fails():
  text = ("| a | `layers.py:1`, `:2` | b | `capsjax/models/layers.py` `kernel_init`; `:40` |\n"
          "\n"
          "Prose citing `capsjax/models/capsnet.py:23-28`.\n")
  assert page_line_numbers(text) == ["capsjax/models/layers.py, then `:40`",
                                     "capsjax/models/capsnet.py:23"]
