"""A renderer declares what its target can do in one frozen record, `renderer.caps` (kernopt.renderers.Capabilities):
every field documented with one default, no dialect class or instance shadowing a field, nothing in kernopt reading a
capability with a fallback default, nothing in the repository reading one through the old spelling `renderer.<field>`,
and the heuristics profile chosen by the record's `heuristics` field."""
import ast
import copy
import dataclasses
import importlib
import pathlib
import pkgutil
import re
import pytest
import catalogue
import kernopt.renderers
from kernopt.errors import UnsupportedError
from kernopt.heuristics_registry import heuristics_profile, register_heuristics
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.renderers import KEY_CAPS, Capabilities, Renderer, get_renderer
from kernopt.renderers.native import ISA_LEVELS, NativeCRenderer, native_capabilities

FIELDS = {f.name for f in dataclasses.fields(Capabilities)}
ROOT = pathlib.Path(kernopt.renderers.__file__).parents[2]   # the repository

def kernopt_renderers() -> list[type]:
  """Every Renderer subclass defined in kernopt, once all of its renderer modules and the PYTHON device's are loaded."""
  for m in pkgutil.iter_modules(kernopt.renderers.__path__): importlib.import_module(f"kernopt.renderers.{m.name}")
  importlib.import_module("kernopt.runtime.python")
  found, todo = [], [Renderer]
  while todo:
    for sub in todo.pop().__subclasses__():
      todo.append(sub)
      if sub.__module__.startswith("kernopt."): found.append(sub)
  return found

def test_every_field_has_one_default_and_a_one_line_doc():
  for f in dataclasses.fields(Capabilities):
    assert f.default is not dataclasses.MISSING and f.default_factory is dataclasses.MISSING, f.name
    doc = f.metadata.get("doc", "")
    assert doc and "\n" not in doc and len(doc) <= 110, f"{f.name}: {doc!r}"
  assert Capabilities() == Renderer().caps

def test_the_record_is_frozen_and_changes_only_whole():
  r = get_renderer("OPENCL")
  with pytest.raises(dataclasses.FrozenInstanceError): r.caps.vector_width = 8   # type: ignore[misc]
  with pytest.raises(AttributeError): setattr(r, "vector_width", 8)   # no capability lives outside the record
  assert r.caps.vector_width == 1
  r.caps = dataclasses.replace(r.caps, vector_width=8)   # a profile changes by replacing its record
  assert r.caps.vector_width == 8 and r.capabilities()["vector_width"] == 8

def test_renderers_declare_capabilities_only_through_the_record():
  classes = kernopt_renderers()
  names = {c.__name__ for c in classes}
  assert {"CRenderer", "NativeCRenderer", "OpenCLRenderer", "CUDARenderer", "MetalRenderer", "AMDRenderer",
          "PythonRenderer"} <= names, names
  for cls in classes:
    for klass in cls.__mro__[:cls.__mro__.index(Renderer)]:
      assert not FIELDS & set(vars(klass)), f"{klass.__name__} shadows record fields {FIELDS & set(vars(klass))}"
    assert isinstance(cls.caps, Capabilities) and set(cls.key_caps) <= FIELDS, cls.__name__
    assert not set(cls.key_caps) & set(KEY_CAPS), f"{cls.__name__} repeats a common key"

@pytest.mark.parametrize("r", [get_renderer(d) for d in ("C", "OPENCL", "CUDA", "METAL", "AMD")] +
                         [NativeCRenderer(threads=2, isa=ISA_LEVELS["x86-64-v3"])], ids=lambda r: type(r).__name__)
def test_capabilities_are_the_record_fields_the_dialect_keys(r):
  caps = r.capabilities()
  assert list(caps) == ["dialect", *KEY_CAPS, "tensor_cores", *type(r).key_caps]
  assert caps["tensor_cores"] == [str(tc) for tc in r.caps.tensor_cores]
  assert all(caps[k] == getattr(r.caps, k) for k in (*KEY_CAPS, *type(r).key_caps))
  assert not FIELDS & set(vars(r)), f"an instance attribute shadows {FIELDS & set(vars(r))}"

def test_no_capability_is_read_with_a_fallback_default():
  pattern = re.compile(r"\b(?:getattr|hasattr)\(\s*[^,()]+(?:\([^()]*\))?\s*,\s*['\"](\w+)['\"]")
  bad = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in sorted((ROOT / "kernopt").rglob("*.py"))
         for n, line in enumerate(p.read_text().splitlines(), 1)
         for m in pattern.finditer(line) if m.group(1) in FIELDS]
  assert not bad, "read it as renderer.caps.<field>:\n" + "\n".join(bad)

# the expressions that hold a renderer: `<x>.opts` (a Kernel's), `<x>.renderer` (a device's), `<x>.lang` (an Emitter's);
# the names opts, renderer, lang, r, and self in a Renderer class; a call of a *Renderer class or of get_renderer; and
# any name the module binds to one of those (R8 = NativeCRenderer(...)) unless its function binds it to a `.caps`
HOLDER_ATTRS, HOLDER_NAMES = {"opts", "renderer", "lang"}, {"opts", "renderer", "lang", "r"}
SCANNED = ("kernopt", "tests", "benchmarks", "examples", "scripts")

def _call_name(e: ast.AST) -> str:
  f = e.func if isinstance(e, ast.Call) else None
  return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""

def _holds_renderer(e: ast.AST, names: set[str]) -> bool:
  if isinstance(e, ast.Attribute): return e.attr in HOLDER_ATTRS
  if isinstance(e, ast.Name): return e.id in names
  return _call_name(e).endswith("Renderer") or _call_name(e) == "get_renderer"

def _bindings(node: ast.AST) -> list[tuple[str, ast.AST]]:
  """(name, value) for each plain or tuple-unpacking assignment under node."""
  out = []
  for a in ast.walk(node):
    if isinstance(a, ast.Assign) and len(a.targets) == 1:
      t, v = a.targets[0], a.value
      pairs = zip(t.elts, v.elts) if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple) else [(t, v)]
      out += [(t.id, v) for t, v in pairs if isinstance(t, ast.Name)]
  return out

def old_spelling_reads(tree: ast.Module) -> list[ast.Attribute]:
  """Each `<renderer>.<Capabilities field>` in the module (the record reads as `<renderer>.caps.<field>`)."""
  bound = {n for n, v in _bindings(tree) if _holds_renderer(v, HOLDER_NAMES)}
  hits: list[ast.Attribute] = []
  def visit(node: ast.AST, names: set[str]) -> None:
    for ch in ast.iter_child_nodes(node):
      inner = names
      if isinstance(ch, ast.ClassDef):
        bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in ch.bases}
        renderer = any(b.endswith(("Renderer", "Language")) for b in bases)
        inner = names | {"self"} if renderer else names - {"self"}
      elif isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)):
        inner = names - {n for n, v in _bindings(ch) if isinstance(v, ast.Attribute) and v.attr == "caps"}
      if isinstance(ch, ast.Attribute) and ch.attr in FIELDS and _holds_renderer(ch.value, names): hits.append(ch)
      visit(ch, inner)
  visit(tree, HOLDER_NAMES | bound)
  return hits

def test_the_old_spelling_finder_tells_renderers_from_other_holders():
  src = """
R8 = NativeCRenderer(vector_width=8)
a = R8.vector_width + k.opts.has_local + dev.renderer.device + get_renderer("C").threads + r.arch
b = dtype.count + k.opts.caps.has_local + runner.device + self.device + tc.threads + isa.vector_width
def f(k):
  r = k.opts.caps
  return r.shared_max
class X(CStyleLanguage):
  def g(self): return self.clang, self.caps.clang
"""
  found = [ast.unparse(h) for h in old_spelling_reads(ast.parse(src))]
  assert found == ["R8.vector_width", "k.opts.has_local", "dev.renderer.device", "get_renderer('C').threads", "r.arch",
                   "self.clang"]

def test_no_module_reads_a_capability_through_the_old_spelling():
  maybe = re.compile(r"(?<!\bcaps)\.\s*(?:%s)\b" % "|".join(FIELDS))   # only these files can hold one: parse them
  files = {p: p.read_text() for d in SCANNED for p in sorted((ROOT / d).rglob("*.py"))}
  bad = [f"{p.relative_to(ROOT)}:{h.lineno}: {ast.unparse(h)}" for p, text in files.items() if maybe.search(text)
         for h in old_spelling_reads(ast.parse(text))]
  assert not bad, "read it as <renderer>.caps.<field>:\n" + "\n".join(bad)

def test_the_native_record_is_filled_from_the_isa():
  v3 = native_capabilities(threads=2, isa=ISA_LEVELS["x86-64-v3"])
  assert (v3.march, v3.isa_vector_width, v3.vector_width, v3.max_upcast, v3.fused_accumulate, v3.heuristics) == \
    ("x86-64-v3", 8, 8, 16, True, "cpu_native")
  v2 = native_capabilities(threads=1, vector_width=8, isa=ISA_LEVELS["x86-64-v2"])
  assert (v2.isa_vector_width, v2.vector_width, v2.fused_accumulate, v2.parallel) == (4, 8, False, "none")
  assert NativeCRenderer(threads=2, isa=ISA_LEVELS["x86-64-v3"]).caps == v3
  with pytest.raises(UnsupportedError, match="power of two"): native_capabilities(vector_width=3, threads=1)

def _opts(r, name="matmul_64"):
  return Kernel(catalogue.get(name).ast, opts=r).hand_coded_optimizations().applied_opts

def test_the_heuristics_profile_is_the_records_field_not_the_device():
  native = NativeCRenderer(threads=1, isa=ISA_LEVELS["x86-64-v3"])
  alien = copy.copy(native)
  alien.caps = dataclasses.replace(native.caps, device="ALIEN")
  assert _opts(alien) == _opts(native) != _opts(get_renderer("C"))
  as_spec = copy.copy(native)
  as_spec.caps = dataclasses.replace(native.caps, heuristics="spec")
  assert _opts(as_spec) != _opts(native)

def test_a_registered_profile_runs_before_the_spec_rules():
  calls = []
  def declines(k): calls.append(k.name); return False
  def upcasts(k): k.apply_opt(Opt(OptOps.UPCAST, 0, 2)); return True
  register_heuristics("test_capabilities.declines", declines)
  register_heuristics("test_capabilities.upcasts", upcasts)
  assert heuristics_profile("test_capabilities.declines") is declines
  r = get_renderer("C")
  r.caps = dataclasses.replace(r.caps, heuristics="test_capabilities.declines")
  assert _opts(r) == _opts(get_renderer("C")) and len(calls) == 1   # declined: the spec's rules chose
  r.caps = dataclasses.replace(r.caps, heuristics="test_capabilities.upcasts")
  assert _opts(r) == (Opt(OptOps.UPCAST, 0, 2),)

def test_an_unknown_profile_is_refused_before_any_opt():
  """image_out needs a required UPCAST, which the refusal comes before."""
  r = get_renderer("OPENCL")
  r.caps = dataclasses.replace(r.caps, heuristics="no_such_profile")
  k = Kernel(catalogue.get("image_out").ast, opts=r)
  with pytest.raises(UnsupportedError, match="no heuristics profile 'no_such_profile'"): k.hand_coded_optimizations()
  assert k.applied_opts == () and k.required_optimizations().applied_opts != ()
