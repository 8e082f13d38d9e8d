"""The tree is the architecture: each module imports only modules above it in DESIGN.md's table, and the core
imports only the standard library."""
import ast, pathlib, subprocess, sys
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "kernopt"
# DESIGN.md's table, top to bottom; a module may import only from entries at or above its own
# (opt and the heuristics modules are kernopt's split of the table's kernel.py: the Opt data and the rules that
# choose Opts sit below the Kernel that applies them; search_space and validation are split out of search.py;
# ast, the table's "top level" AST builders, sits above runtime so that it stays core: stdlib-only, no numpy)
ORDER = ["dtype", "helpers", "debug", "errors", "shape.symbolic", "shape.view", "shape.shapetracker", "ops", "uops",
         "renderers", "capture", "uopgraph", "lowerer", "opt", "heuristics", "heuristics_cpu", "heuristics_opencl",
         "heuristics_cuda", "kernel", "refusals", "ast", "replay", "runtime", "search_space", "validation", "search",
         "program_cache", "api", "cli", "__main__"]
CORE = set(ORDER[:ORDER.index("runtime")])
STDLIB = set(sys.stdlib_module_names)

def layer_of(module: str) -> str:
  name = module.removeprefix("kernopt.")
  if name == "shape": return "shape.symbolic"  # the package's __init__ sits at the top of its layer
  for entry in sorted(ORDER, key=len, reverse=True):
    if name == entry or name.startswith(entry + "."): return entry
  return name

def imports_of(path: pathlib.Path) -> list[str]:
  """Every module path imports, at any depth, except under `if TYPE_CHECKING:` (types only, never executed)."""
  tree = ast.parse(path.read_text())
  for node in ast.walk(tree):
    if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING": node.body = []
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import): found += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0: found.append(node.module)
  return found

MODULES = sorted(p for p in ROOT.rglob("*.py") if p.name != "__init__.py" or p.parent != ROOT)

@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_flow_one_way(path):
  rel = path.relative_to(ROOT).with_suffix("")
  module = ".".join(p for p in rel.parts if p != "__init__")
  mine = layer_of(module)
  if mine not in ORDER: pytest.skip(f"{module} is not in DESIGN.md's table")
  for imp in imports_of(path):
    if imp == "kernopt" or imp.startswith("kernopt."):
      theirs = layer_of(imp) if imp != "kernopt" else "dtype"
      if theirs in ORDER: assert ORDER.index(theirs) <= ORDER.index(mine), f"{module} imports {imp}, which is below it"
    elif mine in CORE:
      assert imp.split(".")[0] in STDLIB, f"core module {module} imports third-party {imp}"

def test_import_kernopt_pulls_in_no_third_party_module():
  code = ("import sys, kernopt, kernopt.kernel, kernopt.renderers.cstyle; "
          "bad = [m for m in ('numpy', 'pyopencl', 'pycuda', 'cuda') if m in sys.modules]; print(bad)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
  assert out == "[]"

def test_public_names_load_lazily():
  """DESIGN.md's `from kernopt import Kernel, Device, Buffer` works, and only then is numpy imported."""
  code = ("import sys, kernopt; before = 'numpy' in sys.modules; "
          "from kernopt import Kernel, Opt, OptOps, Device, Buffer; "
          "print(before, 'numpy' in sys.modules, Kernel.__module__, Device.DEFAULT, Buffer.__name__)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
  assert out == ["False", "True", "kernopt.kernel", "CPU", "Buffer"]
