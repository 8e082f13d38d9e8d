"""Every kernopt module's docstring says what it imports, and says it truly: one sentence "Imports a, b and c." naming
the kernopt modules it imports (a package name covers its submodules: `shape/` or `renderers`), "Imports only the
standard library." or "Imports nothing from kernopt."; anything after a ";" in that sentence is free text. The
sentence is checked against every import in the module, at module level, in functions and under TYPE_CHECKING."""
import ast
import pathlib
import re
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "kernopt"
MODULES = sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)
SENTENCE = re.compile(r"(?:^|(?<=[.:]\s))Imports ([^.;]*(?:\.[A-Za-z_][^.;]*)*)[.;]")
NAME = re.compile(r"^(?:kernopt\.)?([a-z_][a-z_0-9]*(?:[./][a-z_0-9]+)*)/?$")

def module_name(path: pathlib.Path) -> str:
  rel = path.relative_to(ROOT.parent).with_suffix("")
  return ".".join(p for p in rel.parts if p != "__init__")

def declared(doc: str) -> tuple[set[str], str]:
  """The kernopt modules the docstring's Imports sentence names, and the sentence (empty when there is none)."""
  m = SENTENCE.search(" ".join(doc.split()))
  if m is None: return set(), ""
  body = m.group(1).strip().removeprefix("only ")
  if body.startswith("nothing from kernopt"): return set(), m.group(0)
  body = re.sub(r"^the standard library(,| and)?\s*", "", body)
  names = set()
  for tok in re.split(r",\s*|\s+and\s+", body) if body else []:
    got = NAME.match(tok.strip().strip("`"))
    if got is None: raise AssertionError(f"{tok!r} in {m.group(0)!r} is not a module name")
    names.add("kernopt." + got.group(1).replace("/", "."))
  return names, m.group(0)

def imported(path: pathlib.Path) -> set[str]:
  """Every kernopt module the file imports, anywhere in it (relative imports resolved)."""
  mod = module_name(path)
  pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import): found |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        up = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
        base = ".".join(up + ([base] if base else []))
      found.add(base)
      for a in node.names:   # `from kernopt import debug` imports the module kernopt.debug
        sub = ROOT.parent / (base + "." + a.name).replace(".", "/")
        if sub.with_suffix(".py").exists() or (sub / "__init__.py").exists(): found.add(f"{base}.{a.name}")
  return {f for f in found if f.startswith("kernopt.") and f != mod}

def covered(name: str, names: set[str]) -> bool:
  return any(name == n or name.startswith(n + ".") for n in names)

@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_sentence_is_true(path: pathlib.Path) -> None:
  doc = ast.get_docstring(ast.parse(path.read_text())) or ""
  names, sentence = declared(doc)
  assert sentence, f"{module_name(path)}'s docstring has no 'Imports ...' sentence"
  actual = imported(path)
  missing = sorted(a for a in actual if not covered(a, names))
  unused = sorted(n for n in names if not any(covered(a, {n}) for a in actual))
  assert not missing and not unused, f"{module_name(path)}: {sentence!r} omits {missing}, names unused {unused}"

def test_the_sentence_parser_reads_the_forms_the_docstrings_use() -> None:
  assert declared("Owns X. Imports dtype, shape/ and renderers; the Kernel is passed in.")[0] == \
    {"kernopt.dtype", "kernopt.shape", "kernopt.renderers"}
  assert declared("Imports only the standard library.") == (set(), "Imports only the standard library.")
  assert declared("Imports the standard library and helpers.")[0] == {"kernopt.helpers"}
  assert declared("Owns nothing.")[1] == ""
  with pytest.raises(AssertionError): declared("Imports everything below it.")
  assert covered("kernopt.shape.view", {"kernopt.shape"}) and not covered("kernopt.shapes", {"kernopt.shape"})

def test_the_design_docs_module_map_lists_every_module() -> None:
  design = (ROOT.parent / "docs" / "design.md").read_text()
  table = design[design.index("## Module map"):design.index("## Departures from the spec")]
  listed = set(re.findall(r"^\| `(kernopt/[^`]+\.py)` \|", table, re.M))
  files = {str(p.relative_to(ROOT.parent)) for p in MODULES}
  assert listed == files, f"missing from docs/design.md: {sorted(files - listed)}; gone: {sorted(listed - files)}"

def test_no_module_is_past_600_lines() -> None:
  """Issue 16's size bound: a module past ~600 lines holds more than one thing; split it where its parts meet."""
  long = {str(p.relative_to(ROOT.parent)): n for p in MODULES if (n := len(p.read_text().splitlines())) > 600}
  assert not long, f"modules past 600 lines: {long}"
