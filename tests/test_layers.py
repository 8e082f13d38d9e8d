"""The tree is the architecture: each module imports only modules above it in DESIGN.md's table (type-only imports
under TYPE_CHECKING and imports inside functions too), and the core imports only the standard library."""
import ast, pathlib, subprocess, sys
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "kernopt"
# DESIGN.md's table, top to bottom; a module may import only from entries at or above its own. kernopt's splits:
# ops is a facade over lazyop, alu, verify and serialize, and uopgraph over patterns and linearizer; the table's
# kernel.py is opt (the Opt data), decisions, loop_nest (the Kernel's state and shape algebra), shape_opts,
# tensor_core_fit and optimized_ast above kernel, and the heuristics below it, where the table has them, using only
# its public API (they register in heuristics_registry, which the Kernel reads); search_config, search_space,
# validation, tuning_file and search_workers are split out of search.py; ast, the table's "top level" AST builders,
# sits above runtime so that it stays core (stdlib-only, no numpy); lower_index, lower_vectors, lower_reduce and
# lower_float4 are split out of the lowerer, above it
ORDER = ["dtype", "helpers", "debug", "errors", "shape.symbolic", "shape.conditions", "shape.view",
         "shape.shapetracker", "lazyop", "alu", "verify", "serialize", "ops", "uops", "renderers", "capture",
         "patterns", "linearizer", "uopgraph", "passes", "lower_index", "lower_vectors", "lower_reduce",
         "lower_float4", "lowerer", "opt", "decisions", "loop_nest", "shape_opts", "tensor_core_fit", "optimized_ast",
         "heuristics_registry", "kernel", "heuristics", "heuristics_cpu", "heuristics_opencl", "heuristics_cuda",
         "refusals", "ast", "replay", "runtime", "search_config", "search_space", "validation", "tuning_file",
         "search_workers", "search", "program_cache", "api", "cli", "__main__"]
CORE = set(ORDER[:ORDER.index("runtime")])
STDLIB = set(sys.stdlib_module_names)

def layer_of(module: str) -> str:
  name = module.removeprefix("kernopt.")
  if name == "shape": return "shape.symbolic"  # the package's __init__ sits at the top of its layer
  for entry in sorted(ORDER, key=len, reverse=True):
    if name == entry or name.startswith(entry + "."): return entry
  return name

def _is_type_checking(node: ast.AST) -> bool:
  test = getattr(node, "test", None)
  return isinstance(node, ast.If) and (getattr(test, "id", None) == "TYPE_CHECKING" or
                                       getattr(test, "attr", None) == "TYPE_CHECKING")

def _is_module(name: str) -> bool:
  if not name.startswith("kernopt."): return False
  path = ROOT.joinpath(*name.split(".")[1:])
  return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()

def imports_of(path: pathlib.Path) -> list[tuple[str, str]]:
  """(module, where) for every import in path at any depth: where is "", "under TYPE_CHECKING" or "inside a
  function". A type-only or deferred import is still an import of that module: it obeys the table too."""
  found: list[tuple[str, str]] = []
  def visit(node: ast.AST, where: str) -> None:
    if isinstance(node, ast.Import): found.extend((a.name, where) for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      # `from kernopt import heuristics` imports the module kernopt.heuristics, not just the package
      subs = [f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")]
      found.extend((m, where) for m in subs or [node.module])
    for child in ast.iter_child_nodes(node):
      inner = where
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)): inner = where or "inside a function"
      if _is_type_checking(node) and child in node.body: inner = "under TYPE_CHECKING"
      visit(child, inner)
  visit(ast.parse(path.read_text()), "")
  return found

MODULES = sorted(p for p in ROOT.rglob("*.py") if p.name != "__init__.py" or p.parent != ROOT)

def violations(module: str, found: list[tuple[str, str]]) -> list[str]:
  """Each import in `found` that goes up the table, or out of the standard library from the core."""
  mine, bad = layer_of(module), []
  for imp, where in found:
    said = f"{module} imports {imp}" + (f" {where}" if where else "")
    if imp == "kernopt" or imp.startswith("kernopt."):
      theirs = layer_of(imp) if imp != "kernopt" else "dtype"
      if theirs in ORDER and ORDER.index(theirs) > ORDER.index(mine):
        bad.append(f"{said}, which is below it")
    elif mine in CORE and where != "under TYPE_CHECKING" and imp.split(".")[0] not in STDLIB:
      bad.append(f"core module {said}: third-party")
  return bad

@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_flow_one_way(path):
  rel = path.relative_to(ROOT).with_suffix("")
  module = ".".join(p for p in rel.parts if p != "__init__")
  if layer_of(module) not in ORDER: pytest.skip(f"{module} is not in DESIGN.md's table")
  assert violations(module, imports_of(path)) == []

def test_type_only_and_deferred_imports_obey_the_table_too(tmp_path):
  src = tmp_path / "m.py"
  src.write_text("from typing import TYPE_CHECKING\nfrom kernopt import dtype, ops\n"
                 "if TYPE_CHECKING: from kernopt.kernel import Kernel\n"
                 "def f():\n  import numpy\n  from kernopt import heuristics\n")
  found = imports_of(src)
  assert found == [("typing", ""), ("kernopt.dtype", ""), ("kernopt.ops", ""),
                   ("kernopt.kernel", "under TYPE_CHECKING"), ("numpy", "inside a function"),
                   ("kernopt.heuristics", "inside a function")]
  assert violations("shape_opts", found) == [
    "shape_opts imports kernopt.kernel under TYPE_CHECKING, which is below it",
    "core module shape_opts imports numpy inside a function: third-party",
    "shape_opts imports kernopt.heuristics inside a function, which is below it"]
  assert violations("heuristics", found) == ["core module heuristics imports numpy inside a function: third-party"]

def test_import_kernopt_pulls_in_no_third_party_module():
  code = ("import sys, kernopt, kernopt.kernel, kernopt.renderers.cstyle; "
          "bad = [m for m in ('numpy', 'pyopencl', 'pycuda', 'cuda') if m in sys.modules]; print(bad)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
  assert out == "[]"

def test_the_kernel_alone_gets_every_heuristics_profile():
  """The profiles, below the Kernel, register themselves as the package loads; kernel.py never imports them."""
  code = ("import sys; from kernopt.kernel import Kernel; from kernopt.heuristics_registry import heuristics_names; "
          "print(heuristics_names(), 'numpy' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
  assert out == "['cpu_native', 'cuda_gpu', 'opencl_cpu', 'spec'] False"

def test_public_names_load_lazily():
  """DESIGN.md's `from kernopt import Kernel, Device, Buffer` works, and only then is numpy imported."""
  code = ("import sys, kernopt; before = 'numpy' in sys.modules; "
          "from kernopt import Kernel, Opt, OptOps, Device, Buffer; "
          "print(before, 'numpy' in sys.modules, Kernel.__module__, Device.DEFAULT, Buffer.__name__)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
  assert out == ["False", "True", "kernopt.kernel", "CPU", "Buffer"]
