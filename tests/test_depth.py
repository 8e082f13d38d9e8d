"""Deep ASTs (issue 14, item 8): every layer walks a 10,000-deep AST without recursion. LazyOp's hash, equality,
dtype, lazyops and repr, the verifier, the canonical JSON and digest, print_tree, the AST builders, Kernel (its
derived trackers, name, optimized AST), the lowerer, the UOp rewrites and linearizer, the renderers of every dialect
and the PYTHON device; compiled runs are compared with numpy, which evaluates the same chain op by op.

The runs happen in a thread with a 512 KiB stack under the default recursion limit of 1,000, as when a framework
calls kernopt from a worker thread: a walk that recursed once per level of a 10,000-deep tree would fail there.
DEPTH_N=<depth> changes the depth; DEPTH_ALL=1 runs every chain on every device (CPU static and pinned native,
PYTHON emulating each dialect, OPENCL when present), with no opts and with the standard protocol."""
from __future__ import annotations
import io
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Callable
import numpy as np
import pytest
from kernopt import ast as A
from kernopt.dtype import DType, dtypes
from kernopt.errors import UnsupportedError
from kernopt.kernel import Kernel
from kernopt.ops import (BinaryOps, BufferOps, ConstBuffer, LazyOp, MemBuffer, MetaOps, TernaryOps, UnaryOps,
                         ast_digest, ast_dumps, ast_from_json, ast_to_json, format_tree, print_tree, verify_lazyop)
from kernopt.renderers import get_renderer
from kernopt.runtime import Buffer, Device
from kernopt.runtime import cpu
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.shape.view import View

DEPTH = int(os.environ.get("DEPTH_N", "10000"))
ALL = os.environ.get("DEPTH_ALL", "") not in ("", "0")
STACK = 512 * 1024
needs_cc = pytest.mark.skipif(not cpu.CPUDevice.availability()[0], reason="no C compiler")

def in_small_thread(fn: Callable[[], Any]) -> Any:
  """fn() in a fresh thread with a STACK-byte stack; its exception re-raised here."""
  out: dict[str, Any] = {}
  def run() -> None:
    try: out["ret"] = fn()
    except BaseException as e: out["err"] = e  # noqa: BLE001  (handed to the caller)
  old = threading.stack_size(STACK)
  try:
    t = threading.Thread(target=run)
    t.start()
  finally: threading.stack_size(old)
  t.join()
  if "err" in out: raise out["err"]
  return out.get("ret")

# ***** the chains, and numpy evaluating them op by op *****

SHAPE = (8, 4)

def _const(val: Any, dt: DType) -> LazyOp:
  return LazyOp(BufferOps.CONST, (), ConstBuffer(val, dt, ShapeTracker((View.create(SHAPE, (0, 0)),))))

def _load(dt: DType) -> LazyOp: return LazyOp(BufferOps.LOAD, (), MemBuffer(1, dt, ShapeTracker.from_shape(SHAPE)))

def _kernel(x: LazyOp) -> LazyOp:
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (x,), MemBuffer(0, x.dtype, ShapeTracker.from_shape(SHAPE))),))

# each step: (how the AST grows by it, what numpy computes for it, how many AST levels it adds)
Step = tuple[Callable[[LazyOp], LazyOp], Callable[[np.ndarray], np.ndarray], int]

def _steps(kind: str) -> tuple[DType, list[Step]]:
  if kind == "add":   # x + 1.0, on integer-valued floats: exact in any association
    one = _const(1.0, dtypes.float)
    return dtypes.float, [(lambda x: LazyOp(BinaryOps.ADD, (x, one)), lambda v: v + np.float32(1), 1)]
  if kind == "mixed_int":   # ADD, MUL by a constant (wrapping), MAX, NEG, a CAST round trip through int64
    i = dtypes.int32
    c3, cm = _const(3, i), _const(-1000, i)
    return i, [(lambda x: LazyOp(BinaryOps.ADD, (x, c3)), lambda v: v + np.int32(3), 1),
               (lambda x: LazyOp(BinaryOps.MUL, (x, c3)), lambda v: v * np.int32(3), 1),
               (lambda x: LazyOp(BinaryOps.MAX, (x, cm)), lambda v: np.where(v > -1000, v, np.int32(-1000)), 1),
               (lambda x: LazyOp(UnaryOps.NEG, (x,)), lambda v: -v, 1),
               (lambda x: LazyOp(UnaryOps.CAST, (LazyOp(UnaryOps.CAST, (x,), dtypes.int64),), i),
                lambda v: v.astype(np.int64).astype(np.int32), 2)]
  if kind == "mixed_float":   # the same on floats, the round trip through half (rounding to nearest even)
    f = dtypes.float
    ch, cm = _const(0.5, f), _const(-1.0, f)
    return f, [(lambda x: LazyOp(BinaryOps.ADD, (x, ch)), lambda v: v + np.float32(0.5), 1),
               (lambda x: LazyOp(BinaryOps.MUL, (x, ch)), lambda v: v * np.float32(0.5), 1),
               (lambda x: LazyOp(BinaryOps.MAX, (x, cm)), lambda v: np.where(v > -1, v, np.float32(-1)), 1),
               (lambda x: LazyOp(UnaryOps.NEG, (x,)), lambda v: -v, 1),
               (lambda x: LazyOp(UnaryOps.CAST, (LazyOp(UnaryOps.CAST, (x,), dtypes.half),), f),
                lambda v: v.astype(np.float16).astype(np.float32), 2)]
  if kind == "where":   # x < 0 ? x + 3 : x + -1
    i = dtypes.int32
    z, c3, cm1 = _const(0, i), _const(3, i), _const(-1, i)
    def grow(x: LazyOp) -> LazyOp:
      return LazyOp(TernaryOps.WHERE, (LazyOp(BinaryOps.CMPLT, (x, z)), LazyOp(BinaryOps.ADD, (x, c3)),
                                       LazyOp(BinaryOps.ADD, (x, cm1))))
    return i, [(grow, lambda v: np.where(v < 0, v + np.int32(3), v + np.int32(-1)), 2)]
  raise ValueError(kind)

KINDS = ("add", "mixed_int", "mixed_float", "where")

def chain(kind: str, depth: int = DEPTH) -> tuple[LazyOp, Callable[[np.ndarray], np.ndarray]]:
  """A KERNEL storing a chain of at least `depth` levels of `kind`'s steps over buffer 1, and its numpy value."""
  dt, steps = _steps(kind)
  x, n, todo = _load(dt), 0, []
  while n < depth:
    grow, ref, levels = steps[len(todo) % len(steps)]
    x, n = grow(x), n + levels
    todo.append(ref)
  def oracle(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
      for ref in todo: v = ref(v)
    return v
  return _kernel(x), oracle

def nesting(ast: LazyOp) -> int:
  """The number of levels from ast to its deepest leaf (children before parents: each op's after its sources')."""
  depth: dict[LazyOp, int] = {}
  for op in ast.lazyops: depth[op] = 1 + max((depth[s] for s in op.src), default=0)
  return depth[ast]

def inputs(kind: str) -> np.ndarray:
  rng = np.random.default_rng(7)
  if kind in ("add", "mixed_float"): return rng.integers(-3, 4, SHAPE).astype(np.float32)
  return rng.integers(-50, 50, SHAPE).astype(np.int32)

def check_run(kind: str, ast: LazyOp, oracle: Callable, dev: Any, optimize: bool) -> None:
  """ast compiled for dev (no opts, or the standard protocol) and launched matches numpy's evaluation."""
  k = Kernel(ast, opts=dev.renderer)
  if optimize:
    k.required_optimizations()
    if not k.apply_tensor_cores(): k.hand_coded_optimizations()
    assert k.applied_opts, "the standard protocol applied nothing: the kernel is too small to test it"
  prg = k.to_program()
  x = inputs(kind)
  out, inp = Buffer(dev.name, x.size, ast.src[0].arg.dtype), Buffer(dev.name, x.size, ast.src[0].arg.dtype).copyin(x)
  dev.compile(prg)(out, inp, wait=True)
  want = oracle(x.copy()).reshape(-1)
  if kind == "mixed_float": np.testing.assert_allclose(out.numpy(), want, rtol=1e-6, atol=1e-6)
  else: np.testing.assert_array_equal(out.numpy(), want)

# ***** the AST layer *****

def test_lazyop_is_iterative_at_depth():
  """hash, ==, dtype, lazyops, verify, JSON round trip, digest, repr and print_tree on a DEPTH-deep chain."""
  def body() -> None:
    for kind in ("mixed_int", "where") if ALL else ("mixed_int",):
      ast, _ = chain(kind)
      twin, _ = chain(kind)
      assert nesting(ast) >= DEPTH + 2
      assert ast is not twin and hash(ast) == hash(twin) and ast == twin
      # unequal only at the bottom: the walk must reach it
      other = _kernel(_swap_leaf(ast.src[0].src[0], _load(dtypes.int32), LazyOp(BufferOps.LOAD, (), MemBuffer(
        2, dtypes.int32, ShapeTracker.from_shape(SHAPE)))))
      assert other != ast and ast != other
      assert ast.src[0].src[0].dtype == dtypes.int32
      ops = ast.lazyops
      pos = {op: i for i, op in enumerate(ops)}
      assert ops[-1] is ast and len(pos) == len(ops) and all(pos[s] < pos[op] for op in ops for s in op.src)
      sts = verify_lazyop(ast)
      assert sts[ast.src[0]].shape == SHAPE
      back = ast_from_json(ast_to_json(ast))
      assert back == ast and ast_dumps(back) == ast_dumps(ast) and ast_digest(twin) == ast_digest(ast)
      text = repr(ast)
      assert text.startswith("LazyOp(MetaOps.KERNEL, src=(LazyOp(BufferOps.STORE, src=(") and text.endswith("arg=None)")
      assert text.count("LazyOp(") == len(ops) and "#1=LazyOp(" in text   # shared ops spelled once
      f = io.StringIO()
      print_tree(ast, file=f)
      assert f.getvalue().count("\n") == len(format_tree(ast).splitlines()) >= len(ops)
  in_small_thread(body)

def _swap_leaf(x: LazyOp, old: LazyOp, new: LazyOp) -> LazyOp:
  """x with leaf `old` replaced by `new`, rebuilt bottom-up (children before parents, no recursion)."""
  made: dict[LazyOp, LazyOp] = {}
  for op in x.lazyops:
    made[op] = new if op == old else LazyOp(op.op, tuple(made[s] for s in op.src), op.arg)
  return made[x]

def _reference_lazyops(x: LazyOp, out: dict) -> None:
  for s in x.src: _reference_lazyops(s, out)
  out.setdefault(x, None)

def _reference_repr(x: LazyOp) -> str:
  uses: dict[LazyOp, int] = {}
  for op in x.lazyops:
    for s in op.src: uses[s] = uses.get(s, 0) + 1
  labels: dict[LazyOp, str] = {}
  def spell(y: LazyOp) -> str:
    if y in labels: return labels[y]
    head = ""
    if uses.get(y, 0) > 1:
      labels[y] = f"#{len(labels) + 1}"
      head = labels[y] + "="
    srcs = [spell(s) for s in y.src]
    return f"{head}LazyOp({y.op}, src=({', '.join(srcs)}{',' * (len(srcs) == 1)}), arg={y.arg!r})"
  return spell(x)

def test_walks_match_their_recursive_definitions_on_shared_trees():
  """lazyops is dedup(children's lazyops in order + [self]), == is structural and repr nests sources (a shared one
  spelled once, then named), as their recursive definitions say, on small random DAGs with shared sub-trees."""
  rng = np.random.default_rng(3)
  for _ in range(40):
    nodes = [_load(dtypes.int32), _const(2, dtypes.int32), _const(5, dtypes.int32)]
    for _ in range(int(rng.integers(3, 14))):
      op = [BinaryOps.ADD, BinaryOps.MUL, UnaryOps.NEG, TernaryOps.WHERE][int(rng.integers(4))]
      pick = [nodes[int(j)] for j in rng.integers(0, len(nodes), 3)]
      if op is UnaryOps.NEG: nodes.append(LazyOp(op, (pick[0],)))
      elif op is TernaryOps.WHERE: nodes.append(LazyOp(op, (LazyOp(BinaryOps.CMPLT, (pick[0], pick[1])), *pick[1:])))
      else: nodes.append(LazyOp(op, tuple(pick[:2])))
    ast = _kernel(nodes[-1])
    ref: dict = {}
    _reference_lazyops(ast, ref)
    assert ast.lazyops == list(ref) and repr(ast) == _reference_repr(ast)
    rebuilt = _swap_leaf(ast, _const(5, dtypes.int32), _const(5, dtypes.int32))
    changed = _swap_leaf(ast, _const(5, dtypes.int32), _const(6, dtypes.int32))
    assert rebuilt == ast and (changed == ast) == (_const(5, dtypes.int32) not in ast.lazyops)

def test_builders_at_depth():
  """kernopt.ast's builders (shape checks included) build and verify a DEPTH-deep chain."""
  def body() -> LazyOp:
    x, one = A.load(1, dtypes.float, SHAPE), A.const(1.0, dtypes.float, SHAPE)
    for _ in range(DEPTH // 2): x = A.neg(A.add(x, one))
    return A.kernel(A.store(0, x))
  assert nesting(in_small_thread(body)) >= DEPTH + 2

# ***** kernel, lowering, rendering, running *****

@needs_cc
def test_deep_chains_run_on_cpu_and_python():
  """DEPTH-deep chains equal numpy: x + 1 + 1 ... compiled for the CPU's static profile with no opts, the mixed
  chain with the standard protocol on the PYTHON device. (gcc 12 -O2 needs ~3 s for the first, far longer for the
  mixed chain's MAX branches: the compiled runs of every chain are DEPTH_ALL's.)"""
  add, add_ref = chain("add")
  mixed, mixed_ref = chain("mixed_int")
  def body() -> None:
    k = Kernel(mixed, opts=Device.open("PYTHON").renderer)
    assert k.name == "E_32" and k.display_name.startswith("E_")
    check_run("add", add, add_ref, Device.open("CPU", profile="static"), optimize=False)
    check_run("mixed_int", mixed, mixed_ref, Device.open("PYTHON"), optimize=True)
  in_small_thread(body)

@pytest.mark.skipif(not ALL, reason="the long form: DEPTH_ALL=1")
@pytest.mark.parametrize("dialect", ["CPU", "OPENCL", "CUDA", "METAL", "AMD"])
def test_every_dialect_renders_a_deep_chain(dialect):
  ast, _ = chain("where")
  prg = in_small_thread(lambda: Kernel(ast, opts=get_renderer(dialect)).hand_coded_optimizations().to_program())
  assert "data1" in prg.src and prg.src.count("(") == prg.src.count(")")

def _devices() -> list[tuple[str, Any]]:
  devs: list[tuple[str, Any]] = [("PYTHON", Device.open("PYTHON"))]
  devs += [(f"PYTHON-{e}", Device.open("PYTHON", emulate=e)) for e in ("CUDA", "METAL", "AMD")]
  if cpu.CPUDevice.availability()[0]:
    devs += [("CPU-static", Device.open("CPU", profile="static")), ("CPU-native", Device.open("CPU", threads=2,
                                                                                                  vector_width=8))]
  if "OPENCL" in Device.available(): devs.append(("OPENCL", Device["OPENCL"]))
  return devs

@pytest.mark.skipif(not ALL, reason="the long form: DEPTH_ALL=1")
@pytest.mark.parametrize("optimize", [False, True], ids=["no_opts", "protocol"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_chain_on_every_device(kind, optimize):
  ast, oracle = chain(kind)
  for name, dev in _devices():
    try: in_small_thread(lambda: check_run(kind, ast, oracle, dev, optimize))
    except UnsupportedError as e:
      assert kind == "mixed_float" and "METAL" in name and "half" in str(e), f"{name}: {e}"

_POCL_DEEP = """
import sys
sys.path.insert(0, {tests!r})
import test_depth as T
from kernopt.runtime import Device
from kernopt.runtime import opencl
if {off!r}: opencl.on_build_stack = lambda fn: fn()
ast, oracle = T.chain("mixed_int")
T.in_small_thread(lambda: T.check_run("mixed_int", ast, oracle, Device["OPENCL"], False))
print("matched")
"""

def test_opencl_builds_a_deep_kernel_called_from_a_small_stack_thread():
  """PoCL's LLVM recurses once per expression level while it builds: kernopt builds on a thread of its own with a
  large stack, so a framework's 512 KiB worker thread gets numbers, not a segfault (which the same run shows with
  the build moved back onto the caller's thread). Both caches are off, so the build really happens."""
  if "OPENCL" not in Device.available(): pytest.skip("no OpenCL device")
  env = dict(os.environ, DISABLE_CACHE="1", POCL_KERNEL_CACHE="0", DEPTH_N="10000")
  def run(off: bool) -> subprocess.CompletedProcess:
    code = _POCL_DEEP.format(tests=os.path.dirname(os.path.abspath(__file__)), off=off)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
  good = run(False)
  assert good.returncode == 0 and "matched" in good.stdout, good.stderr[-2000:]
  if ALL:   # the control: the same build on the caller's small stack crashes the process
    assert run(True).returncode == -signal.SIGSEGV
