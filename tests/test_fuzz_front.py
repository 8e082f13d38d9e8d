"""Front-end fuzz: hypothesis-generated malformed LazyOp trees, Views, movement-op arguments, Opts, Buffers, device
options and runner calls. Whatever is accepted is fine; every exception raised must be a KernoptError with a message.
FUZZ_FRONT_N sets hypothesis' max_examples per test (default: about 30 s in all); run with -s for the counts, and
FUZZ_FRONT_STATS=<file> to have them written there as JSON."""
import atexit
import collections
import json
import math
import os
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from kernopt.dtype import DType, dtypes
from kernopt.errors import KernoptError
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.ops import (BinaryOps, BufferOps, ConstBuffer, LazyOp, MemBuffer, MetaOps, ReduceOps, TernaryOps,
                         UnaryOps, verify_lazyop)
from kernopt.renderers import get_renderer
from kernopt.runtime import Buffer, Device, cpu
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.shape.symbolic import Variable
from kernopt.shape.view import View

N = int(os.environ.get("FUZZ_FRONT_N", "0"))
COUNTS: collections.Counter = collections.Counter()
SETTINGS = dict(deadline=None, derandomize=not N, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])

def examples(default: int) -> settings:
  return settings(max_examples=N or default, **SETTINGS)

def _report() -> None:
  if not COUNTS: return
  if path := os.environ.get("FUZZ_FRONT_STATS"):
    with open(path, "w") as f: json.dump(dict(sorted(COUNTS.items())), f, indent=1)
  print("\nfront fuzz outcomes:\n" + "\n".join(f"  {k:50s} {v}" for k, v in sorted(COUNTS.items())))
atexit.register(_report)

def attempt(what: str, fn, *args, **kwargs):
  """fn(*args, **kwargs), or None after checking that what it raised is a KernoptError with a message."""
  try: ret = fn(*args, **kwargs)
  except KernoptError as e:
    assert str(e).strip(), f"{what}: {type(e).__name__} without a message"
    COUNTS[f"{what}: {type(e).__name__}"] += 1
    return None
  except Exception as e:
    raise AssertionError(f"{what} raised {type(e).__name__}: {e}") from e
  COUNTS[f"{what}: accepted"] += 1
  return ret

# ***** values: right, almost right and wrong *****

N_VAR = Variable("n", 1, 8)
DTYPES = list(dict.fromkeys(dtypes.fields().values()))
BAD_DTYPES = [dtypes.float.vec(4), DType(100, 4, "foo4", None, 4), DType(11, 4, "float", "f", 1),
              dtypes.imagef((2, 2, 4)), dtypes.imageh((4, 1, 4))]
JUNK = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=3),
                 st.binary(max_size=2), st.lists(st.integers(-1, 4), max_size=3), st.just({}), st.just(object()),
                 st.sampled_from([np.int64(3), np.int32(-1), np.uint8(2), np.float32(2.0), np.bool_(True), 2**63,
                                  -2**63 - 1, math.nan, math.inf, N_VAR, N_VAR * 2, N_VAR - 9])).map(lambda x: x)
# (mapped, so that one_of(good, JUNK) draws JUNK as one branch: hypothesis flattens nested one_of)
SMALL = st.one_of(st.integers(0, 6), st.integers(1, 4), st.integers(-2, 8), st.just(N_VAR), JUNK)
DTYPE = st.one_of(st.sampled_from(DTYPES), st.sampled_from(DTYPES), st.sampled_from(BAD_DTYPES), JUNK)
GOOD_SHAPE = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)
SHAPE = st.one_of(st.lists(SMALL, max_size=4).map(tuple), GOOD_SHAPE, GOOD_SHAPE, st.lists(SMALL, max_size=3), JUNK)
PAIRS = st.one_of(st.lists(st.tuples(SMALL, SMALL), max_size=4).map(tuple), st.lists(st.lists(SMALL, max_size=3),
                                                                                    max_size=3), JUNK)
OPS = [*UnaryOps, *BinaryOps, *TernaryOps, *ReduceOps, *BufferOps, *MetaOps]

@st.composite
def tree(draw, depth: int = 0):
  """(op, [children], arg, src as list?) as plain data: built inside the test, where construction may refuse it."""
  leaf = depth >= 3 or draw(st.integers(0, 2)) == 0
  op = draw(st.one_of(st.sampled_from([BufferOps.LOAD, BufferOps.CONST]) if leaf else st.sampled_from(OPS),
                      st.sampled_from(["ADD", 3, None, OptOps.UPCAST])))
  kids = [] if leaf else draw(st.lists(tree(depth + 1), max_size=3))
  arg = draw(st.one_of(
    st.tuples(st.just("mem"), st.one_of(st.integers(-2, 3), JUNK), DTYPE, SHAPE),
    st.tuples(st.just("const"), st.one_of(st.integers(-5, 300), st.floats(), st.just(10**400), JUNK), DTYPE, SHAPE),
    st.tuples(st.just("axes"), st.one_of(st.lists(st.integers(-1, 3), max_size=3).map(tuple), JUNK)),
    st.tuples(st.just("raw"), st.one_of(DTYPE, JUNK))))
  return op, kids, arg, draw(st.booleans()) and draw(st.booleans())

FLOAT_ALU = [UnaryOps.NEG, UnaryOps.EXP2, UnaryOps.SQRT, BinaryOps.ADD, BinaryOps.MUL, BinaryOps.MAX,
             TernaryOps.MULACC]
ARITY = {UnaryOps: 1, BinaryOps: 2, TernaryOps: 3}

@st.composite
def good_tree(draw, depth: int = 0):
  """A well-formed float tree over the base shape, in tree()'s form; test_malformed_lazyop_trees then breaks a part."""
  if depth >= 3 or draw(st.integers(0, 2)) == 0:
    if draw(st.booleans()): return BufferOps.LOAD, [], ("mem", draw(st.integers(1, 3)), dtypes.float, None), False
    return BufferOps.CONST, [], ("const", draw(st.floats(-4, 4)), dtypes.float, None), False
  op = draw(st.sampled_from(FLOAT_ALU))
  return op, [draw(good_tree(depth + 1)) for _ in range(ARITY[type(op)])], ("raw", None), False

@st.composite
def broken_tree(draw):
  """A well-formed tree with at most one part (an op, its sources, its arg) replaced by tree()'s junk."""
  t = draw(good_tree())
  if draw(st.integers(0, 3)) == 0: return t
  path = []
  node = t
  while node[1] and draw(st.booleans()):
    i = draw(st.integers(0, len(node[1]) - 1))
    path.append(i)
    node = node[1][i]
  junk = draw(tree(2))
  part = draw(st.integers(0, 3))
  new = tuple(junk[j] if j == part else node[j] for j in range(4))
  def put(n, p):
    if not p: return new
    kids = list(n[1])
    kids[p[0]] = put(kids[p[0]], p[1:])
    return (n[0], kids, n[2], n[3])
  return put(t, path)

def _st(shape):
  return shape if isinstance(shape, ShapeTracker) else ShapeTracker.from_shape(shape)

def build_arg(arg, base):
  kind = arg[0]
  if kind == "mem": return MemBuffer(arg[1], arg[2], _st(base if arg[3] is None else arg[3]))
  if kind == "const": return ConstBuffer(arg[1], arg[2], _st(base if arg[3] is None else arg[3]))
  return arg[1]

def build(t, base):
  op, kids, arg, as_list = t
  src = [build(k, base) for k in kids]
  return LazyOp(op, src if as_list else tuple(src), build_arg(arg, base))

BASES = st.sampled_from([(4,), (4, 4), (2, 3, 4), (N_VAR, 4)])

@examples(200)
@given(t=st.one_of(tree(), broken_tree(), broken_tree()), base=BASES,
       out_dtype=st.one_of(st.just(dtypes.float), st.just(dtypes.float), DTYPE),
       dialect=st.sampled_from(["CPU", "OPENCL", "CUDA", "METAL", "AMD"]), protocol=st.booleans(),
       reduce=st.one_of(st.none(), st.lists(st.integers(0, 2), min_size=1, max_size=2, unique=True).map(tuple)))
def test_malformed_lazyop_trees(t, base, out_dtype, dialect, protocol, reduce):
  value = attempt("LazyOp tree", build, t, base)
  if value is None: return
  out_shape = base
  if reduce is not None and all(a < len(base) for a in reduce):
    value = attempt("reduce", LazyOp, ReduceOps.SUM, (value,), reduce)
    if value is None: return
    out_shape = tuple(1 if i in reduce else d for i, d in enumerate(base))
  out = attempt("STORE", lambda: LazyOp(BufferOps.STORE, (value,), MemBuffer(0, out_dtype, _st(out_shape))))
  if out is None: return
  ast = attempt("KERNEL", LazyOp, MetaOps.KERNEL, (out,))
  if ast is None or attempt("verify_lazyop", verify_lazyop, ast) is None: return
  k = attempt("Kernel", Kernel, ast, opts=get_renderer(dialect))
  if k is None: return
  if protocol and attempt("protocol", lambda: k.required_optimizations().hand_coded_optimizations()) is None: return
  attempt("to_program", k.to_program)

@examples(800)
@given(shape=SHAPE, strides=st.one_of(st.none(), SHAPE), offset=st.one_of(st.integers(-3, 9), JUNK),
       mask=st.one_of(st.none(), PAIRS))
def test_malformed_views(shape, strides, offset, mask):
  v = attempt("View.create", View.create, shape, strides, offset, mask)
  if v is not None:
    attempt("View.create again", View.create, shape, strides, offset, mask)   # a cache hit refuses the same
    s = ShapeTracker((v,))
    attempt("view analysis", lambda: (s.simplify(), s.real_strides(), s.expr_idxs(), s.size, v.minify()))

MOVES = st.sampled_from(["reshape", "permute", "expand", "pad", "shrink", "stride"])

@examples(800)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple), moves=st.lists(st.tuples(
  MOVES, st.one_of(SHAPE, PAIRS, st.permutations([0, 1, 2]).map(tuple))), min_size=1, max_size=4),
  symbolic=st.booleans())
def test_malformed_movement_ops(shape, moves, symbolic):
  s = ShapeTracker.from_shape((N_VAR, *shape[1:]) if symbolic else shape)
  for name, arg in moves:
    nxt = attempt(f"ShapeTracker.{name}", getattr(s, name), arg)
    if nxt is None: return
    s = nxt
    attempt("tracker analysis", lambda: (s.simplify(), s.real_strides(), s.unit_stride_axes(), s.expr_idxs()))

def _opt_kernel(dialect: str) -> Kernel:
  a = LazyOp(BufferOps.LOAD, (), MemBuffer(1, dtypes.float, ShapeTracker.from_shape((64, 32, 16))))
  r = LazyOp(ReduceOps.SUM, (a,), (2,))
  return Kernel(LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (r,), MemBuffer(
    0, dtypes.float, ShapeTracker.from_shape((64, 32, 1)))),)), opts=get_renderer(dialect))

KERNELS = {d: _opt_kernel(d) for d in ("CPU", "OPENCL", "CUDA")}

@examples(600)
@given(opts=st.lists(st.tuples(st.one_of(st.sampled_from(list(OptOps)), JUNK), st.one_of(st.integers(-1, 4), JUNK),
                               st.one_of(st.sampled_from([None, 0, 2, 4, 8, 16, 32, 7]), JUNK)),
                     min_size=1, max_size=4),
       dialect=st.sampled_from(sorted(KERNELS)))
def test_malformed_opts(opts, dialect):
  k = KERNELS[dialect].copy()
  for o in opts:
    opt = attempt("Opt", Opt, *o)
    if opt is None or attempt("apply_opt", k.apply_opt, opt) is None: return
  attempt("to_program after opts", k.to_program)

@pytest.fixture(scope="module")
def runner():
  if not cpu.CPUDevice.availability()[0]: pytest.skip("no C compiler")
  s = ShapeTracker.from_shape((N_VAR,))
  ld = LazyOp(BufferOps.LOAD, (), MemBuffer(1, dtypes.float, s))
  ast = LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (ld,), MemBuffer(0, dtypes.float, s)),))
  dev = Device.open("CPU", threads=1)
  return dev.compile(Kernel(ast, opts=dev.renderer).to_program())

DEVICES = st.one_of(st.sampled_from(["CPU", "cpu", "PYTHON", "NOPE"]), st.just("CPU"), JUNK)

@examples(400)
@given(device=DEVICES, dtype=DTYPE, size=st.one_of(st.integers(0, 64), st.integers(0, 64), st.integers(-2**65, -1),
                                                  st.integers(2**48, 2**65), JUNK))
def test_malformed_buffers(device, size, dtype):
  attempt("Buffer", Buffer, device, size, dtype)

KEYS = st.one_of(st.sampled_from(["n", N_VAR, Variable("n", 1, 8), "m"]), JUNK)
VARVALS = st.one_of(st.dictionaries(KEYS.filter(lambda k: getattr(type(k), "__hash__", None) is not None),
                                    st.one_of(st.integers(-2, 10), JUNK), max_size=3),
                    st.builds(lambda v: {"n": v}, st.integers(1, 8)), st.none(), JUNK)

@examples(600)
@given(var_vals=VARVALS, nbufs=st.sampled_from([2, 2, 2, 0, 1, 3]),
       sizes=st.lists(st.integers(0, 9), min_size=3, max_size=3),
       dtype=st.sampled_from([dtypes.float, dtypes.float, dtypes.int32]),
       junk_buf=st.one_of(st.none(), st.none(), st.none(), JUNK), wait=st.one_of(st.booleans(), st.booleans(), JUNK))
def test_malformed_runner_calls(runner, var_vals, nbufs, sizes, dtype, junk_buf, wait):
  bufs = [Buffer("CPU", sz, dtype) for sz in sizes[:nbufs]]
  if junk_buf is not None and bufs: bufs[0] = junk_buf
  attempt("runner call", runner, *bufs, var_vals=var_vals, wait=wait)

OPTIONS = st.dictionaries(st.sampled_from(["threads", "profile", "parallel", "vector_width", "min_parallel_work",
                                           "fused_accumulate", "bogus"]),
                          st.one_of(st.sampled_from([1, 2, 4, "native", "static", "pthread", "none", True]), JUNK),
                          max_size=2)

@examples(200)
@given(name=st.one_of(st.sampled_from(["CPU", "cpu", "NOPE", "PYTHON"]), JUNK), options=OPTIONS)
def test_malformed_device_options(name, options):
  if name in ("PYTHON",): options = {k: v for k, v in options.items() if k == "bogus"}
  attempt("Device.open", Device.open, name, **options)
