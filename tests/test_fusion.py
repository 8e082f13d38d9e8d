"""Kernels with several reduces, nested reduces and zero-sized dimensions (docs/fusion.md), each run with no opts, the
standard protocol and random legal Opts on CPU (native and static), PYTHON (plain and emulating CUDA) and OPENCL when
it is available, and compared with numpy."""
from __future__ import annotations
import math
from typing import Any, Callable, Optional
import numpy as np
import pytest
from kernopt import Buffer, Device, Kernel
from kernopt import ast as A
from kernopt.dtype import DType, dtypes
from kernopt.errors import KernelOptError
from kernopt.kernel import Opt, OptOps
from kernopt.ops import LazyOp
from kernopt.renderers import get_renderer
from kernopt.shape.symbolic import Variable, create_lt_node, sint
from tests.fuzz import generate

F = dtypes.float
LOG2E, LN2 = 1.0 / math.log(2.0), math.log(2.0)
N, M, D = 4, 8, 4

# ***** the kernels: (AST, input shapes by buffer, output shape, numpy reference of the inputs) *****

def _row(shape: tuple, axis: int, rank: int, stride: int = 1, m: sint = M) -> Any:
  """Buffer 1, an (n, m) matrix, viewed over `shape` with its rows along axis 0 and its columns along `axis`."""
  strides: list[sint] = [0] * rank
  strides[0], strides[axis] = m * stride, stride
  return A.load(1, F, A.view(shape, strides))

def _exp(x: LazyOp) -> LazyOp: return A.exp2(A.mul(x, LOG2E))

def softmax_parts(n: sint = N, m: sint = M) -> tuple[LazyOp, LazyOp, LazyOp]:
  """Full shape (n, o, j, k): the numerator's centred x at (n, o, 1, 1), the row max over k at (n, o, 1, 1), and
  the sum over j of exp(x_j - max over k) at (n, o, 1, 1): the max nested in the sum."""
  def row(shape: tuple, axis: int) -> LazyOp: return _row(shape, axis, 4, m=m)
  inner_max = A.max(row((n, m, m, m), 3), 3)                                        # (n, m, m, 1)
  total = A.sum(_exp(A.sub(row((n, m, m, 1), 2), inner_max)), 2)                    # (n, m, 1, 1)
  row_max = A.max(row((n, m, 1, m), 3), 3)                                          # (n, m, 1, 1)
  return A.sub(row((n, m, 1, 1), 1), row_max), row_max, total

def softmax(n: sint = N, m: sint = M) -> tuple:
  centred, _, total = softmax_parts(n, m)
  def ref(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)
  return A.kernel(A.store(0, A.div(_exp(centred), total))), ref

def log_softmax(n: sint = N, m: sint = M) -> tuple:
  centred, _, total = softmax_parts(n, m)
  def ref(x: np.ndarray) -> np.ndarray:
    c = x - x.max(1, keepdims=True)
    return c - np.log(np.exp(c).sum(1, keepdims=True))
  return A.kernel(A.store(0, A.sub(centred, A.mul(A.log2(total), LN2)))), ref

def _inv(m: sint, x: LazyOp) -> LazyOp:
  """x * (1/m): for a symbolic m, the symbolic CONST m cast to float, then its reciprocal."""
  if isinstance(m, int): return A.mul(x, 1.0 / m)
  return A.mul(x, A.recip(A.cast(A.const(m, dtypes.int32, A.shape_of(x)), F)))

def _mean(shape: tuple, axis: int, m: sint = M) -> LazyOp:
  return _inv(m, A.sum(_row(shape, axis, len(shape), m=m), axis))

def layernorm(n: sint = N, m: sint = M) -> tuple:
  """(x - mean) / sqrt(var + eps) over rows, full shape (n, o, j, k): var's mean (over k) nested in var (over j).
  Over a symbolic m the variance divides by the float CONST holding m."""
  dev = A.sub(_row((n, m, m, 1), 2, 4, m=m), _mean((n, m, m, m), 3, m))
  sq = A.sum(A.mul(dev, dev), 2)                                                    # (n, m, 1, 1)
  var = A.mul(sq, 1.0 / m) if isinstance(m, int) else A.div(sq, A.const(m, F, A.shape_of(sq)))
  out = A.mul(A.sub(_row((n, m, 1, 1), 1, 4, m=m), _mean((n, m, 1, m), 3, m)), A.recip(A.sqrt(A.add(var, 1e-5))))
  def ref(x: np.ndarray) -> np.ndarray:
    return (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)
  return A.kernel(A.store(0, out)), ref

def mean_var() -> tuple:
  """Two outputs of shape (N, 1, 1) over the full shape (N, j, k): the mean and the variance of each row."""
  dev = A.sub(_row((N, M, 1), 1, 3), _mean((N, M, M), 2))
  var = A.mul(A.sum(A.mul(dev, dev), 1), 1.0 / M)
  mean = _mean((N, 1, M), 2)
  ast = A.kernel(A.store(0, mean), A.store(2, var))
  return ast, lambda x: {0: x.mean(1), 2: x.var(1)}

def sum_and_max() -> tuple:
  """out[i] = sum_j x[i, j] + max_k y[i, k]: sibling reduces over different axes of the full shape (N, M, D)."""
  x = A.load(1, F, A.view((N, M, 1), (M, 1, 0)))
  y = A.load(2, F, A.view((N, 1, D), (D, 0, 1)))
  ast = A.kernel(A.store(0, A.add(A.sum(x, 1), A.max(y, 2))))
  return ast, lambda x, y: x.sum(1) + y.max(1)

def max_then_sum() -> tuple:
  """out[i] = sum_j max_k a[i, j, k]: the inner reduce reads the outer one's loop index, so it runs inside it."""
  ast = A.kernel(A.store(0, A.sum(A.max(A.load(1, F, (N, M, D)), 2), 1)))
  return ast, lambda a: a.max(2).sum(1)

def attention_softmax(n: sint = N, m: sint = M) -> tuple:
  """softmax over keys of the scores q @ k^T (q: (n, D), k: (m, D)), full shape (n, o, j, jj, d): the score's sum
  over d nested in the max over jj, nested in the sum over j."""
  def scores(shape: tuple, key_axis: int) -> LazyOp:
    q = A.load(1, F, A.view(shape, (D, 0, 0, 0, 1)))
    strides = [0, 0, 0, 0, 1]
    strides[key_axis] = D
    return A.sum(A.mul(q, A.load(2, F, A.view(shape, strides))), 4)
  inner_max = A.max(scores((n, m, m, m, D), 3), 3)                                  # (n, m, m, 1, 1)
  total = A.sum(_exp(A.sub(scores((n, m, m, 1, D), 2), inner_max)), 2)              # (n, m, 1, 1, 1)
  row_max = A.max(scores((n, m, 1, m, D), 3), 3)
  out = A.div(_exp(A.sub(scores((n, m, 1, 1, D), 1), row_max)), total)
  def ref(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    s = q @ k.T
    e = np.exp(s - s.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)
  return A.kernel(A.store(0, out)), ref

# name -> (builder, input shapes by buffer index, output shapes by buffer index)
CASES: dict[str, tuple[Callable, dict[int, tuple], dict[int, tuple]]] = {
  "softmax": (softmax, {1: (N, M)}, {0: (N, M)}),
  "log_softmax": (log_softmax, {1: (N, M)}, {0: (N, M)}),
  "layernorm": (layernorm, {1: (N, M)}, {0: (N, M)}),
  "mean_var": (mean_var, {1: (N, M)}, {0: (N,), 2: (N,)}),
  "sum_and_max": (sum_and_max, {1: (N, M), 2: (N, D)}, {0: (N,)}),
  "max_then_sum": (max_then_sum, {1: (N, M, D)}, {0: (N,)}),
  "attention_softmax": (attention_softmax, {1: (N, D), 2: (M, D)}, {0: (N, M)}),
}

# ***** devices and running *****

def _devices() -> list[tuple[str, Callable[[], Any]]]:
  devs: list[tuple[str, Callable[[], Any]]] = [
    ("cpu_native", lambda: Device["CPU"]), ("cpu_static", lambda: Device.open("CPU", profile="static")),
    ("python", lambda: Device.open("PYTHON")), ("python_cuda", lambda: Device.open("PYTHON", emulate="CUDA"))]
  if "OPENCL" in Device.available(): devs.append(("opencl", lambda: Device["OPENCL"]))
  return devs

DEVICES = _devices()

def run_kernel(dev: Any, k: Kernel, inputs: dict[int, np.ndarray], outputs: dict[int, tuple],
               dt: DType = F) -> dict[int, np.ndarray]:
  """Launch k with the inputs and return each output, reshaped."""
  bufs = {i: Buffer(dev, max(1, a.size), dt).copyin(a.reshape(-1)) if a.size else Buffer(dev, 1, dt)
          for i, a in inputs.items()}
  bufs.update({i: Buffer(dev, max(1, int(np.prod(s))), dt) for i, s in outputs.items()})
  dev.compile(k.to_program())(*[bufs[i] for i in sorted(bufs)], wait=True)
  return {i: bufs[i].numpy()[:int(np.prod(s))].reshape(s) for i, s in outputs.items()}

def _inputs(shapes: dict[int, tuple], seed: int = 0) -> dict[int, np.ndarray]:
  rng = np.random.default_rng(seed)
  return {i: rng.uniform(-2, 2, s).astype(np.float32) for i, s in shapes.items()}

def _reference(ref: Callable, inputs: dict[int, np.ndarray], outputs: dict[int, tuple]) -> dict[int, np.ndarray]:
  got = ref(*[inputs[i].astype(np.float64) for i in sorted(inputs)])
  return {i: np.asarray(v).reshape(outputs[i]) for i, v in (got.items() if isinstance(got, dict) else [(0, got)])}

def _check(dev: Any, k: Kernel, name: str) -> None:
  build, ins, outs = CASES[name]
  _, ref = build()
  inputs = _inputs(ins)
  want = _reference(ref, inputs, outs)
  got = run_kernel(dev, k, inputs, outs)
  for i in outs:
    np.testing.assert_allclose(got[i], want[i], rtol=1e-4, atol=1e-5, err_msg=f"{name} {k.applied_opts} out {i}")

def protocol(k: Kernel) -> Kernel:
  k.required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  return k

@pytest.fixture(scope="module", params=[d[0] for d in DEVICES])
def device(request: Any) -> Any: return dict(DEVICES)[request.param]()

@pytest.mark.parametrize("name", list(CASES))
def test_no_opts(device: Any, name: str) -> None:
  _check(device, Kernel(CASES[name][0]()[0], opts=device.renderer), name)

@pytest.mark.parametrize("name", list(CASES))
def test_standard_protocol(device: Any, name: str) -> None:
  _check(device, protocol(Kernel(CASES[name][0]()[0], opts=device.renderer)), name)

@pytest.mark.parametrize("name", list(CASES))
def test_random_opts(device: Any, name: str) -> None:
  kernels, _, problems = generate(CASES[name][0]()[0], device.renderer, 3, seed=17, name=name)
  assert not problems, problems
  for k in kernels: _check(device, k, name)

# ***** over a symbolic axis: one compiled program per kernel, launched at several values of the Variable *****

SYM_M, SYM_N = Variable("m", 1, 16), Variable("n", 1, 6)
# name -> (builder, its (n, m), input shapes and output shape as functions of (n, m), the (n, m) values launched)
SYM_CASES: dict[str, tuple[Callable, tuple, Callable, Callable, list[tuple[int, int]]]] = {
  "softmax": (softmax, (N, SYM_M), lambda n, m: {1: (n, m)}, lambda n, m: (n, m), [(N, 1), (N, 7), (N, 16)]),
  "log_softmax": (log_softmax, (N, SYM_M), lambda n, m: {1: (n, m)}, lambda n, m: (n, m), [(N, 1), (N, 5), (N, 16)]),
  "layernorm": (layernorm, (N, SYM_M), lambda n, m: {1: (n, m)}, lambda n, m: (n, m), [(N, 1), (N, 6), (N, 16)]),
  "layernorm_batch": (layernorm, (SYM_N, SYM_M), lambda n, m: {1: (n, m)}, lambda n, m: (n, m),
                      [(1, 3), (5, 16), (6, 9)]),
  "attention_softmax": (attention_softmax, (N, SYM_M), lambda n, m: {1: (n, D), 2: (m, D)}, lambda n, m: (n, m),
                        [(N, 1), (N, 5), (N, 11)]),
}

# log_softmax and layernorm (over m only) are softmax and layernorm_batch with another last op: off the two reference
# devices they run the standard protocol only, to keep the default run short
SYM_PROTOCOL_ONLY = {"log_softmax", "layernorm"}

def _sym_kernels(device: Any, ast: LazyOp, name: str) -> list[Kernel]:
  """The three plans: no opts, the standard protocol, and a random legal Opt sequence (its seed differs per device
  and kernel, so the devices together try several)."""
  if name in SYM_PROTOCOL_ONLY and device.renderer not in (Device["CPU"].renderer, Device.open("PYTHON").renderer):
    return [protocol(Kernel(ast, opts=device.renderer))]
  seed = sum(map(ord, f"{device.renderer.caps.device}{type(device.renderer).__name__}{name}"))
  kernels, _, problems = generate(ast, device.renderer, 1, seed=seed, name=name)
  assert not problems, problems
  plans = [Kernel(ast, opts=device.renderer), protocol(Kernel(ast, opts=device.renderer)), *kernels]
  return list({k.applied_opts: k for k in reversed(plans)}.values())   # a plan that adds no Opt runs once

@pytest.mark.parametrize("name", list(SYM_CASES))
def test_symbolic_axis(device: Any, name: str) -> None:
  build, (n, m), ins, out, values = SYM_CASES[name]
  ast, ref = build(n, m)
  assert {v.expr for v in ast.vars()} == {v.expr for v in (n, m) if isinstance(v, Variable)}
  for k in _sym_kernels(device, ast, name):
    runner = device.compile(k.to_program())
    for nv, mv in values:
      inputs = _inputs(ins(nv, mv), seed=nv * 100 + mv)
      want = ref(*[inputs[i].astype(np.float64) for i in sorted(inputs)])
      bufs = {i: Buffer(device, a.size, F).copyin(a.reshape(-1)) for i, a in inputs.items()}
      bufs[0] = Buffer(device, nv * mv, F)
      vv = {v.expr: val for v, val in ((n, nv), (m, mv)) if isinstance(v, Variable)}
      runner(*[bufs[i] for i in sorted(bufs)], var_vals=vv, wait=True)
      np.testing.assert_allclose(bufs[0].numpy().reshape(out(nv, mv)), want, rtol=1e-4, atol=1e-5,
                                 err_msg=f"{name} {k.applied_opts} at {vv}")

# ***** the Kernel's view of several reduces *****

def test_one_kernel_each_row_once() -> None:
  """softmax's reduces don't read the output axis o: each is computed once per row, before the loop over o, and
  its two row maxes (one under the sum, one for the output, through different views) are one loop."""
  k = Kernel(softmax()[0], opts=get_renderer("CPU"))
  assert len(k.reduceops) == 3 and k.full_shape == (N, M, M, M)
  src = k.to_program().src
  assert src.count("for (") == 4, src   # rows, then the max and the sum loops and the output loop inside it

def test_layernorm_takes_each_row_mean_once() -> None:
  """layernorm's mean under the variance and the mean for the output are one loop: rows, mean, variance, output."""
  src = Kernel(layernorm()[0], opts=get_renderer("CPU")).to_program().src
  assert src.count("for (") == 4, src

def test_sibling_reduces_full_shape() -> None:
  """No buffer spans (N, M, D) in sum_and_max: the Kernel tracks the full shape with a tracker of its own."""
  k = Kernel(sum_and_max()[0], opts=get_renderer("CPU"))
  assert k.full_shape == (N, M, D) and k.sts[k.full_buf_index].shape == (N, M, D) and k.first_reduce == 1

@pytest.mark.parametrize("op", [OptOps.GROUP, OptOps.GROUPTOP])
def test_group_refused_with_several_reduces(op: OptOps) -> None:
  k = Kernel(softmax()[0], opts=get_renderer("OPENCL"))
  before = (k.sts, k.applied_opts, k.group_for_reduces)
  with pytest.raises(KernelOptError, match="several reduces"): k.apply_opt(Opt(op, 0, 2))
  assert (k.sts, k.applied_opts, k.group_for_reduces) == before

@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dialect", ["CPU", "OPENCL", "CUDA", "METAL", "AMD"])
def test_heuristics_never_refused(name: str, dialect: str) -> None:
  """The hand-coded rules of every dialect pick only Opts they are allowed (or none) for these kernels."""
  k = protocol(Kernel(CASES[name][0]()[0], opts=get_renderer(dialect)))
  k.linearize()

def test_tensor_cores_refused_when_nested() -> None:
  k = Kernel(attention_softmax()[0], opts=get_renderer("CUDA"))
  assert not k.apply_tensor_cores(use_tensor_cores=1) and k.applied_opts == ()

# ***** zero-sized dimensions *****

ZERO_CASES: list[tuple[str, tuple, Optional[int], DType]] = [
  ("sum", (4, 0), 1, F), ("max", (4, 0), 1, F), ("max", (4, 0), 1, dtypes.int32), ("sum", (4, 0), 1, dtypes.int32),
  ("sum", (0, 4), 1, F), ("add", (0, 4), None, F), ("sum", (3, 0, 2), 1, F)]

def _zero_ref(op: str, x: np.ndarray, axis: Optional[int]) -> np.ndarray:
  if op == "add": return x + x
  if op == "sum": return x.sum(axis, keepdims=True)
  init = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
  if x.size: return x.max(axis, keepdims=True)
  return np.full(x.shape[:axis] + (1,) + x.shape[axis + 1:], init, x.dtype)

@pytest.mark.parametrize("dev_name", ["cpu_native", "cpu_static", "python", "python_cuda"])
@pytest.mark.parametrize("case", ZERO_CASES, ids=lambda c: f"{c[0]}{c[1]}{c[3]}".replace(" ", ""))
@pytest.mark.parametrize("optimize", [False, True])
def test_zero_sized(dev_name: str, case: tuple, optimize: bool) -> None:
  """A zero-size output launches nothing; a reduce over a zero-size axis is its identity (0, -inf or the minimum)."""
  op, shape, axis, dt = case
  dev = dict(DEVICES)[dev_name]()
  x = A.load(1, dt, shape)
  ast = A.kernel(A.store(0, A.add(x, x) if op == "add" else getattr(A, op)(x, axis)))
  k = Kernel(ast, opts=dev.renderer)
  if optimize: protocol(k)
  assert not optimize or k.applied_opts == ()
  want = _zero_ref(op, np.zeros(shape, np.float32 if dt == F else np.int32), axis)
  got = run_kernel(dev, k, {1: np.zeros(shape, want.dtype)}, {0: want.shape}, dt)[0]
  np.testing.assert_array_equal(got, want)

def test_zero_sized_axis_refuses_opts() -> None:
  k = Kernel(A.kernel(A.store(0, A.sum(A.load(1, F, (4, 0)), 1))), opts=get_renderer("OPENCL"))
  for opt in (Opt(OptOps.UNROLL, 0, 0), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.GROUPTOP, 0, 16)):
    with pytest.raises(KernelOptError, match="size 0"): k.apply_opt(opt)
  assert k.applied_opts == ()

# ***** symbolic CONSTs: an int expression of the kernel's Variables, rendered from the launch's var_vals *****

NV = Variable("n", 1, 64)
I32 = dtypes.int32

def _sym_const_kernel() -> LazyOp:
  """out[i] = x[i] + (n*3 + 1) // 2 in int32, and y[i] * float(n % 5 + 1) in float, over a length-4 axis."""
  a = A.add(A.load(2, I32, (4,)), A.const((NV * 3 + 1) // 2, I32, (4,)))
  b = A.mul(A.load(3, F, (4,)), A.const(NV % 5 + 1, F, (4,)))
  return A.kernel(A.store(0, a), A.store(1, b))

@pytest.mark.parametrize("dev_name", ["cpu_native", "python", "python_cuda", "python_metal", "python_amd", "opencl"])
def test_symbolic_const_values(dev_name: str) -> None:
  """The CONST's value at each n, against Python's own arithmetic on n (the oracle), on every device present."""
  opener = dict(DEVICES, python_metal=lambda: Device.open("PYTHON", emulate="METAL"),
                python_amd=lambda: Device.open("PYTHON", emulate="AMD")).get(dev_name)
  if opener is None: pytest.skip(f"{dev_name} is not available here")
  dev, ast = opener(), _sym_const_kernel()
  assert ast.vars() == [NV]
  runner = dev.compile(protocol(Kernel(ast, opts=dev.renderer)).to_program())
  x, y = np.arange(4, dtype=np.int32) - 2, np.float32([0.5, -1.0, 2.0, 0.25])
  for n in (1, 4, 37, 64):
    bufs = [Buffer(dev, 4, I32), Buffer(dev, 4, F), Buffer(dev, 4, I32).copyin(x), Buffer(dev, 4, F).copyin(y)]
    runner(*bufs, var_vals={"n": n}, wait=True)
    np.testing.assert_array_equal(bufs[0].numpy(), x + (n * 3 + 1) // 2)
    np.testing.assert_array_equal(bufs[1].numpy(), y * np.float32(n % 5 + 1))

@pytest.mark.parametrize("dialect", ["CPU", "OPENCL", "CUDA", "METAL", "AMD"])
def test_symbolic_const_renders_from_the_parameter(dialect: str) -> None:
  """Every dialect spells the CONST from the kernel's parameter for n, never as a number."""
  prg = protocol(Kernel(_sym_const_kernel(), opts=get_renderer(dialect))).to_program()
  assert "v_n" in prg.src and "37" not in prg.src

def test_symbolic_const_round_trips_and_the_oracle_evaluates_it() -> None:
  from kernopt.ops import ast_dumps, ast_from_json, ast_to_json
  from tests import ast_oracle as orc
  ast = _sym_const_kernel()
  assert ast_from_json(ast_to_json(ast)) == ast and ast_dumps(ast_from_json(ast_to_json(ast))) == ast_dumps(ast)
  x, y = np.arange(4, dtype=np.int32), np.ones(4, np.float32)
  ev = orc.evaluate(ast, {2: x, 3: y}, {0: np.zeros(4, np.int32), 1: np.zeros(4, np.float32)}, {"n": 9})
  np.testing.assert_array_equal(ev.buffers[0], x + 14)
  np.testing.assert_array_equal(ev.buffers[1], y * 5)

def _raw_const(val: Any, dt: DType) -> LazyOp:
  from kernopt.ops import BufferOps, ConstBuffer
  return LazyOp(BufferOps.CONST, (), ConstBuffer(val, dt, A.view((4,), (0,))))

def _raw_kernel(value: LazyOp, dt: DType) -> LazyOp:
  from kernopt.ops import BufferOps, MemBuffer, MetaOps
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (value,), MemBuffer(0, dt, A.view((4,), (1,)))),))

SYM_CONST_REFUSALS = [
  ("bool", lambda: _raw_const(NV, dtypes.bool), dtypes.bool, "int or float dtype"),
  ("int8 range", lambda: _raw_const(NV * 3, dtypes.int8), dtypes.int8, "out of range for dtypes.int8"),
  ("unsigned", lambda: _raw_const(Variable("k", -3, 3), dtypes.uint32), dtypes.uint32, "out of range"),
  ("comparison", lambda: _raw_const(create_lt_node(NV, 5), I32), I32, "comparison"),
  ("half overflow", lambda: _raw_const(Variable("big", 1, 100000), dtypes.half), dtypes.half, "overflows"),
]

@pytest.mark.parametrize("case", SYM_CONST_REFUSALS, ids=lambda c: c[0])
def test_symbolic_const_refusals(case: tuple) -> None:
  from kernopt import check
  from kernopt.errors import VerifyError
  _, make, dt, words = case
  ast = _raw_kernel(make(), dt)
  with pytest.raises(VerifyError, match=words) as e: Kernel(ast, opts=get_renderer("CPU"))
  assert str(e.value) in check(ast)

# ***** kernopt.check: every reason Kernel() would refuse an AST *****

def _refused() -> dict[str, LazyOp]:
  from kernopt.ops import BinaryOps, BufferOps, MemBuffer, MetaOps, ReduceOps, WMMAArg
  def load(idx: int, dt: DType, shape: tuple) -> LazyOp:
    return LazyOp(BufferOps.LOAD, (), MemBuffer(idx, dt, A.view(shape)))
  def store(idx: int, v: LazyOp, shape: tuple, dt: DType = F) -> LazyOp:
    return LazyOp(BufferOps.STORE, (v,), MemBuffer(idx, dt, A.view(shape)))
  mixed = LazyOp(BinaryOps.ADD, (load(1, F, (4,)), load(2, I32, (4,))))
  wa = WMMAArg("WMMA", (8, 16, 16), dtypes.half, dtypes.float, (8, 4, 4), "CUDA", (2, 3, 3), (2,))
  wmma = LazyOp(ReduceOps.WMMA, (load(1, dtypes.half, (2, 2, 2)),) * 2, wa)
  K = MetaOps.KERNEL
  return {
    "dtype mix": LazyOp(K, (store(0, mixed, (4,)),)),
    "bad axis": LazyOp(K, (store(0, LazyOp(ReduceOps.SUM, (load(1, F, (4, 4)),), (2,)), (4, 1)),)),
    "store shape": LazyOp(K, (store(0, load(1, F, (4,)), (5,)),)),
    "two problems": LazyOp(K, (store(0, mixed, (4,)), store(1, load(2, I32, (4,)), (4,)))),
    "same buffer twice": LazyOp(K, (store(0, load(1, F, (4,)), (4,)), store(0, load(2, F, (4,)), (4,)))),
    "outputs disagree": LazyOp(K, (store(0, load(1, F, (4,)), (4,)), store(1, load(2, F, (2, 2)), (2, 2)))),
    "wmma unoptimized": LazyOp(K, (store(0, wmma, (2, 2, 1)),)),
    "not a kernel": load(1, F, (4,)),
  }

@pytest.mark.parametrize("name", list(_refused()))
def test_check_lists_what_kernel_raises(name: str) -> None:
  from kernopt import check
  from kernopt.errors import KernoptError
  ast = _refused()[name]
  with pytest.raises(KernoptError) as e: Kernel(ast, opts=get_renderer("CPU"))
  reasons = check(ast)
  assert str(e.value) in reasons, (str(e.value), reasons)
  if name == "two problems":   # each STORE verified on its own: both problems, before any Kernel exists
    assert len(reasons) == 2 and "STORE to buffer 1 of dtypes.float" in reasons[1], reasons

def test_check_accepts_what_kernel_accepts() -> None:
  from kernopt import check
  from tests.catalogue import catalogue
  asts = [c.ast for c in catalogue()] + [b()[0] for b, _, _ in CASES.values()] + [_sym_const_kernel()]
  asts += [SYM_CASES[name][0](*SYM_CASES[name][1])[0] for name in SYM_CASES]
  for ast in asts:
    assert check(ast) == [], (check(ast), ast)
    Kernel(ast, opts=get_renderer("CPU"))

def test_check_with_a_dialect_and_on_garbage() -> None:
  from kernopt import check
  from kernopt.errors import UnsupportedError
  img = A.kernel(A.store(0, A.load(1, dtypes.imagef((2, 2, 4)), (2, 8)), (2, 8)))
  assert check(img) == [] and check(img, opts=get_renderer("OPENCL")) == []
  with pytest.raises(UnsupportedError) as e: Kernel(img, opts=get_renderer("CPU")).to_program()
  assert check(img, opts=get_renderer("CPU")) == [str(e.value)]
  assert check() and check(3) and check(None) # type: ignore[arg-type]

# ***** the native CPU rule for several reduces (heuristics_cpu "cpu.multi_reduce"), at pinned vector widths *****

MR_M = 16   # the row length: 2 vectors of 4 or 8 lanes, 1 vector of 16

def _mr_amt(size: int, w: int) -> int:
  """The rule's unroll of a reduce axis of `size`: two vectors when they divide it, else one."""
  return 2 * w if size % (2 * w) == 0 else w

# name -> (AST at rows of MR_M, input shapes, output shapes, the Opts cpu.multi_reduce says for width w)
MR_CASES: dict[str, tuple[Callable, dict[int, tuple], dict[int, tuple], Callable[[int], list[Opt]]]] = {
  name: (lambda b=b: b(N, MR_M), {1: (N, MR_M)}, {0: (N, MR_M)},
         lambda w: [Opt(OptOps.UNROLL, 1, _mr_amt(MR_M, w)), Opt(OptOps.UNROLL, 0, _mr_amt(MR_M, w)),
                    Opt(OptOps.UPCAST, 1, w)])
  for name, b in (("softmax", softmax), ("log_softmax", log_softmax), ("layernorm", layernorm))}
# mean_var has rows of M=8 and no output axis to vectorize: the two reduce axes are unrolled only
MR_CASES["mean_var"] = (mean_var, {1: (N, M)}, {0: (N,), 2: (N,)},
                        lambda w: [Opt(OptOps.UNROLL, 1, _mr_amt(M, w)), Opt(OptOps.UNROLL, 0, _mr_amt(M, w))])
MR_WIDTHS = [(name, w) for name in MR_CASES for w in (4, 8, 16) if name != "mean_var" or M % w == 0]

@pytest.mark.parametrize("name,w", MR_WIDTHS)
def test_multi_reduce_cpu_rule(name: str, w: int) -> None:
  """Each reduce axis (streamed by x) is unrolled into vectors of accumulators, last first, then the output axis is
  upcast by one vector; the results match numpy."""
  build, ins, outs, want_opts = MR_CASES[name]
  ast, ref = build()
  dev = Device.open("CPU", threads=1, vector_width=w)
  k = protocol(Kernel(ast, opts=dev.renderer))
  assert list(k.applied_opts) == want_opts(w), k.explain()
  assert [d.rule for d in k.explain() if d.opt is not None] == ["cpu.multi_reduce"] * len(want_opts(w))
  inputs = _inputs(ins, seed=w)
  want = _reference(ref, inputs, outs)
  got = run_kernel(dev, k, inputs, outs)
  for i in outs:
    np.testing.assert_allclose(got[i], want[i], rtol=1e-4, atol=1e-5, err_msg=f"{name} w={w} {k.applied_opts}")

def test_multi_reduce_cpu_rule_falls_back() -> None:
  """Where no vector divides a reduce axis (rows of 8 at width 16) the rule records why and unrolls nothing."""
  k = Kernel(mean_var()[0], opts=Device.open("CPU", threads=1, vector_width=16).renderer)
  assert not k.hand_coded_optimizations().applied_opts or all(d.rule != "cpu.multi_reduce" or d.opt is None
                                                               for d in k.explain())
  assert [d.reason for d in k.explain() if d.rule == "cpu.multi_reduce"][-1].startswith("no Opt applied")

# ***** storage floats: a half or bfloat16 SUM accumulates in float32, rounded once *****

def _storage_sum_cases() -> list[tuple[DType, list[Opt]]]:
  opt_sets: list[list[Opt]] = [[], [Opt(OptOps.UNROLL, 0, 4)], [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 8)]]
  return [(dt, opts) for dt in (dtypes.half, dtypes.bfloat16) for opts in opt_sets]

@pytest.mark.parametrize("dt,opts", _storage_sum_cases(), ids=lambda x: str(x))
def test_storage_float_sum_rounds_once(device: Any, dt: DType, opts: list[Opt]) -> None:
  """Rows of 4096 values in [0.5, 1): rounding the accumulator to the storage dtype after every addition would stall
  a bf16 row near 512 and a half row near 2048 (the spacing there exceeds twice the summand), far from the ~3070 the
  row sums to. Accumulated in float32, the result is the float64 row sum rounded once to dt."""
  from tests.ast_oracle import from_storage, to_storage   # the numpy oracle's rounding to nearest even
  rows, n = 8, 4096
  ast = A.kernel(A.store(0, A.sum(A.load(1, dt, (rows, n)), 1)))
  k = Kernel(ast, opts=device.renderer)
  for o in opts: k.apply_opt(o)
  x = to_storage(np.random.default_rng(5).uniform(0.5, 1.0, (rows, n)), dt)
  a, out = Buffer(device, rows * n, dt).copyin(x.reshape(-1)), Buffer(device, rows, dt)
  device.compile(k.to_program())(out, a, wait=True)
  want = to_storage(from_storage(x, dt).astype(np.float64).sum(axis=1), dt)
  got = from_storage(out.numpy(), dt).astype(np.float64)
  # one rounding of the sum, plus float32 accumulation error over 4096 terms (far below half's or bf16's ulp)
  rtol = 2.0 ** -(8 if dt == dtypes.bfloat16 else 10)
  np.testing.assert_allclose(got, from_storage(want, dt).astype(np.float64), rtol=rtol)

# ***** found by an independent tester *****

@pytest.mark.parametrize("dt,build,identity", [
  (F, lambda x: A.sum(x, 1), 0.0), (F, lambda x: A.max(x, 1), -math.inf), (F, lambda x: A.mul(A.sum(x, 1), 2.0), 0.0),
  (dtypes.int32, lambda x: A.sum(x, 1), 0), (dtypes.half, lambda x: A.add(A.max(x, 1), 1.0), -math.inf)],
  ids=["sum", "max", "sum_then_mul", "int_sum", "half_max_then_add"])
def test_reduce_over_a_symbolic_axis_at_zero_is_its_identity(device: Any, dt: DType, build: Callable,
                                                            identity: float) -> None:
  """m = 0 lies in Variable('m', 0, 64): every row is empty, so a SUM is 0 and a MAX -inf, also under the ops after
  the reduce (the PYTHON device left the accumulator's value unset when the loop ran no iteration)."""
  m = Variable("m", 0, 64)
  ast = A.kernel(A.store(0, build(A.load(1, dt, A.view((3, m), (m, 1))))))
  prg = Kernel(ast, opts=device.renderer).to_program()
  out = Buffer(device, 3, dt)
  device.compile(prg)(out, Buffer(device, 3 * 64, dt), var_vals={"m": 0}, wait=True)
  np.testing.assert_array_equal(out.numpy().astype(np.float64), np.full(3, identity))

@pytest.mark.parametrize("optimize", [False, True], ids=["no_opts", "protocol"])
def test_an_output_axis_at_zero_launches_nothing(device: Any, optimize: bool) -> None:
  """n = 0 lies in Variable('n', 0, 5): the outputs have no element, the launch does nothing and the buffers keep
  their contents (an independent tester: OPENCL raised LaunchError for its global size of 0)."""
  n, m = Variable("n", 0, 5), Variable("m", 1, 8)
  x = lambda: A.load(1, F, A.view((n, m), (m, 1)))   # noqa: E731
  k = Kernel(A.kernel(A.store(0, A.sum(x(), 1)), A.store(2, A.max(x(), 1))), opts=device.renderer)
  if optimize: k.required_optimizations().hand_coded_optimizations()
  runner = device.compile(k.to_program())
  x = np.arange(40, dtype=np.float32)
  for nv, mv in ((0, 3), (3, 4)):
    outs = [Buffer(device, 8, F).copyin(np.full(8, 7.0, np.float32)) for _ in range(2)]
    runner(outs[0], Buffer(device, 40, F).copyin(x), outs[1], var_vals={"n": nv, "m": mv}, wait=True)
    rows = x[:nv * mv].reshape(nv, mv)
    for out, want in zip(outs, (rows.sum(1), rows.max(1, initial=-np.inf))):
      np.testing.assert_array_equal(out.numpy(), np.concatenate([want, np.full(8 - nv, 7.0)]).astype(np.float32))

def test_float_to_int_casts_out_of_range_give_zero_everywhere(device: Any) -> None:
  """DESIGN's op semantics: a float CAST to an int truncates, and NaN, inf or a value the int type cannot hold give 0
  (the PYTHON device wrapped them; constant folding wrapped CONST 300.0 -> int8 to 44). The expected values are
  written from that rule with numpy."""
  vals = np.array([128.0, -129.0, 255.9, -1.9, 3e9, np.inf, np.nan, -2.0 ** 31, 2.0 ** 31], np.float32)
  for dt in (dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.uint32, dtypes.int64):
    info = np.iinfo(np.dtype(dt.fmt))
    want = [int(math.trunc(v)) if math.isfinite(v) and info.min <= math.trunc(v) <= info.max else 0
            for v in vals.astype(np.float64).tolist()]
    folded = 300 if info.min <= 300 <= info.max else 0
    ast = A.kernel(A.store(0, A.cast(A.load(1, F, (vals.size,)), dt)),
                   A.store(1 + 1, A.cast(A.const(300.0, F, (vals.size,)), dt)))
    prg = Kernel(ast, opts=device.renderer).to_program()
    a, b = Buffer(device, vals.size, dt), Buffer(device, vals.size, dt)
    device.compile(prg)(a, Buffer(device, vals.size, F).copyin(vals), b, wait=True)
    assert a.numpy().tolist() == want and b.numpy().tolist() == [folded] * vals.size, (dt, a.numpy(), b.numpy())

LOCAL_DEVICES = [name for name, make in DEVICES if make().renderer.caps.has_local]

@pytest.mark.parametrize("opt", [Opt(OptOps.GROUP, 0, 4), Opt(OptOps.GROUPTOP, 0, 4), Opt(OptOps.GROUPTOP, 0, 8)])
@pytest.mark.parametrize("dt", [dtypes.half, dtypes.bfloat16])
@pytest.mark.parametrize("name", LOCAL_DEVICES)
def test_storage_float_group_partials_stay_float(name: str, dt: DType, opt: Opt) -> None:
  """Rows of 500 x 60000, 499 x -60000 and a 7 (found by an independent tester): each work-item's partial sum under
  GROUP/GROUPTOP was rounded to half in the local buffer and overflowed to inf, so the row became NaN. The partials
  stay float32: the row is the float64 sum rounded once (60007 -> 60000 in half, 59904 in bfloat16's spacing)."""
  from tests.ast_oracle import from_storage, to_storage
  device = dict(DEVICES)[name]()
  row = np.concatenate([np.full(500, 60000.0), np.full(499, -60000.0), [7.0]])
  x = to_storage(np.stack([row, row[::-1]]), dt)
  k = Kernel(A.kernel(A.store(0, A.sum(A.load(1, dt, (2, row.size)), 1))), opts=device.renderer)
  k.apply_opt(opt)
  out = Buffer(device, 2, dt)
  device.compile(k.to_program())(out, Buffer(device, x.size, dt).copyin(x.reshape(-1)), wait=True)
  want = from_storage(to_storage(from_storage(x, dt).astype(np.float64).sum(axis=1), dt), dt)
  np.testing.assert_array_equal(from_storage(out.numpy(), dt), want)

@pytest.mark.parametrize("dev_name,make", DEVICES, ids=[d[0] for d in DEVICES])
def test_a_float_sum_of_negative_zeros_is_positive_zero(dev_name, make):
  """SUM starts from its identity +0.0 whether or not a loop remains (a reduce axis of 1, or a wholly unrolled one):
  -0.0 summed is +0.0, as numpy gives and as a loop's accumulator does. The AST fuzzer read it through a BITCAST:
  a size-1 SUM returned the element itself, -0.0, on every device."""
  x = np.array([[-0.0, -0.0], [-0.0, 1.5], [-0.0, -0.0]], np.float32)
  for shape, opts in (((3, 1), []), ((3, 2), []), ((3, 2), [Opt(OptOps.UNROLL, 0, 0)])):
    ast = A.kernel(A.store(0, A.bitcast(A.sum(A.load(1, F, shape), 1), dtypes.int32)))
    k = Kernel(ast, opts=make().renderer)
    for o in opts: k.apply_opt(o)
    dev = make()
    xs = np.ascontiguousarray(x[:, :shape[1]])
    out = Buffer(dev, 3, dtypes.int32)
    dev.compile(k.to_program())(out, Buffer(dev, xs.size, F).copyin(xs.reshape(-1)), wait=True)
    want = np.sum(xs, axis=1, dtype=np.float32)
    assert np.array_equal(out.numpy(), want.view(np.int32)), (shape, out.numpy(), want)
    assert (want.view(np.int32)[[0, 2]] == 0).all()   # numpy's own: +0.0
