"""The team's shared catalogue of kernel ASTs with numpy references, built with a tiny DSL (buf, const, alu, cast,
reduce, store, kernel). `catalogue("small")` is sized for execution tests yet keeps each heuristic branch firing;
`catalogue("large")` has realistic sizes for Kernel tests that run nothing.
Conventions: MemBuffer idx 0.. are outputs, then inputs; `Case.buffers` lists every MemBuffer (numel and numpy shape
at the variables' max values for symbolic cases; the kernel touches a prefix). bfloat16 arrays are uint16 bit patterns
(`BufSpec.np_dtype == np.uint16`): convert with `bf16_to_f32` / `f32_to_bf16`. A symbolic case's reference returns the
valid prefix for the given var_vals, shaped like the kernel's output."""
from __future__ import annotations
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional
import numpy as np
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.ops import BinaryOps, BufferOps, ConstBuffer, LazyOp, MemBuffer, MetaOps, ReduceOps, TernaryOps, UnaryOps
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.shape.symbolic import Variable
from kernopt.shape.view import View

# ***** bfloat16 as uint16 bit patterns *****

def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
  """uint16 bfloat16 bit patterns -> float32 values (exact)."""
  return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)

def f32_to_bf16(x: np.ndarray) -> np.ndarray:
  """float values -> uint16 bfloat16 bit patterns, rounded to nearest even (nan stays a quiet nan)."""
  b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
  rounded = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
  return np.where(np.isnan(np.asarray(x, dtype=np.float32)), np.uint16(0x7FC0), rounded).astype(np.uint16)

_NP = {dtypes.bool: np.bool_, dtypes.int8: np.int8, dtypes.uint8: np.uint8, dtypes.int16: np.int16,
       dtypes.uint16: np.uint16, dtypes.int32: np.int32, dtypes.uint32: np.uint32, dtypes.int64: np.int64,
       dtypes.uint64: np.uint64, dtypes.float16: np.float16, dtypes.bfloat16: np.uint16, dtypes.float32: np.float32,
       dtypes.float64: np.float64}

def np_dtype(dt: DType) -> Any:
  """The numpy dtype that holds dt's values in `inputs` (bfloat16: uint16 bits; images: their base type)."""
  return _NP[dt.base if isinstance(dt, ImageDType) else dt]

# ***** the DSL *****

def view(shape: tuple, strides: tuple, offset: Any = 0, mask: Optional[tuple] = None) -> ShapeTracker:
  """A one-view ShapeTracker with explicit strides (0 = broadcast)."""
  return ShapeTracker((View.create(tuple(shape), tuple(strides), offset, mask),))

def buf(idx: int, shape: tuple, dtype: DType = dtypes.float, st: Optional[ShapeTracker] = None) -> LazyOp:
  """LOAD of MemBuffer idx viewed through st (default: contiguous `shape`)."""
  return LazyOp(BufferOps.LOAD, (), MemBuffer(idx, dtype, st if st is not None else ShapeTracker.from_shape(shape)))

def const(val: Any, shape: tuple, dtype: DType = dtypes.float) -> LazyOp:
  """A constant broadcast (stride 0) to shape."""
  return LazyOp(BufferOps.CONST, (), ConstBuffer(val, dtype, view(shape, (0,) * len(shape))))

def alu(op: Any, *srcs: LazyOp) -> LazyOp: return LazyOp(op, tuple(srcs))
def cast(x: LazyOp, dtype: DType) -> LazyOp: return LazyOp(UnaryOps.CAST, (x,), dtype)
def bitcast(x: LazyOp, dtype: DType) -> LazyOp: return LazyOp(UnaryOps.BITCAST, (x,), dtype)
def reduce(op: ReduceOps, x: LazyOp, axes: tuple) -> LazyOp: return LazyOp(op, (x,), tuple(axes))

def shape_of(x: LazyOp) -> tuple:
  if x.op in BufferOps: return x.arg.st.shape
  if x.op in ReduceOps:
    axes = x.arg.reduce_axes if x.op is ReduceOps.WMMA else x.arg
    return tuple(1 if i in axes else s for i, s in enumerate(shape_of(x.src[0])))
  return shape_of(x.src[0])

def store(x: LazyOp, idx: int = 0, dtype: Optional[DType] = None, st: Optional[ShapeTracker] = None) -> LazyOp:
  """STORE of x into buffer idx (contiguous in x's shape unless st is given)."""
  dt = dtype if dtype is not None else x.dtype
  st = st if st is not None else ShapeTracker.from_shape(shape_of(x))
  return LazyOp(BufferOps.STORE, (x,), MemBuffer(idx, dt, st))

def kernel(*stores: LazyOp) -> LazyOp: return LazyOp(MetaOps.KERNEL, tuple(stores))

# ***** cases *****

class BufSpec(NamedTuple):
  idx: int
  numel: int
  dtype: DType
  shape: tuple
  np_dtype: Any
  output: bool

@dataclass(frozen=True)
class Case:
  """One catalogue entry. `inputs(rng)` gives every non-output buffer; `reference(inputs, var_vals)` every output."""
  name: str
  ast: LazyOp
  buffers: tuple[BufSpec, ...]
  make_inputs: Callable[[np.random.Generator], dict[int, np.ndarray]] = field(repr=False)
  make_reference: Callable[[dict[int, np.ndarray], dict[str, int]], dict[int, np.ndarray]] = field(repr=False)
  var_vals: tuple[dict[str, int], ...] = ({},)
  tags: frozenset[str] = frozenset()
  tol: float = 1e-4   # relative tolerance for float outputs (0: exact)

  def inputs(self, rng: np.random.Generator) -> dict[int, np.ndarray]: return self.make_inputs(rng)
  def reference(self, inputs: dict[int, np.ndarray],
                var_vals: Optional[dict[str, int]] = None) -> dict[int, np.ndarray]:
    return self.make_reference(inputs, var_vals or {})
  @property
  def outputs(self) -> list[BufSpec]: return [b for b in self.buffers if b.output]

def _spec(idx: int, shape: tuple, dtype: DType, output: bool = False) -> BufSpec:
  return BufSpec(idx, int(np.prod(shape, dtype=np.int64)), dtype, tuple(shape), np_dtype(dtype), output)

def _uniform(rng: np.random.Generator, shape: tuple, lo: float = -1.0, hi: float = 1.0,
             dt: Any = np.float32) -> np.ndarray:
  return rng.uniform(lo, hi, size=shape).astype(dt)

def _ints(rng: np.random.Generator, shape: tuple, lo: int, hi: int, dt: Any = np.int32) -> np.ndarray:
  return rng.integers(lo, hi, size=shape).astype(dt)

def _f32(x: np.ndarray) -> np.ndarray: return np.asarray(x).astype(np.float32)

def _case(name: str, ast: LazyOp, outs: list[tuple[int, tuple, DType]], ins: list[tuple[int, tuple, DType]],
          gen: Callable, ref: Callable, tags: set[str], **kw: Any) -> Case:
  bufs = tuple(_spec(i, s, d, True) for i, s, d in outs) + tuple(_spec(i, s, d) for i, s, d in ins)
  return Case(name, ast, bufs, gen, ref, tags=frozenset(tags), **kw)

def _elementwise(S: dict) -> list[Case]:
  n, m = S["ew"]
  shp, f = (n, m), dtypes.float
  cases = [
    _case("add", kernel(store(alu(BinaryOps.ADD, buf(1, shp), buf(2, shp)))), [(0, shp, f)], [(1, shp, f), (2, shp, f)],
          lambda r: {1: _uniform(r, shp), 2: _uniform(r, shp)}, lambda x, v: {0: _f32(x[1].astype(np.float64) + x[2])},
          {"elementwise"}),
    _case("broadcast_add", kernel(store(alu(BinaryOps.ADD, buf(1, shp), buf(2, shp, st=view(shp, (0, 1)))))),
          [(0, shp, f)], [(1, shp, f), (2, (1, m), f)], lambda r: {1: _uniform(r, shp), 2: _uniform(r, (1, m))},
          lambda x, v: {0: _f32(x[1].astype(np.float64) + x[2])}, {"elementwise", "broadcast"}),
    _case("copy", kernel(store(buf(1, shp))), [(0, shp, f)], [(1, shp, f)], lambda r: {1: _uniform(r, shp)},
          lambda x, v: {0: x[1].copy()}, {"copy"}, tol=0.0),
    _case("const", kernel(store(const(3.5, shp))), [(0, shp, f)], [], lambda r: {},
          lambda x, v: {0: np.full(shp, 3.5, np.float32)}, {"const"}, tol=0.0),
  ]
  # pad: the input is (n-2, m-2), viewed padded by one on each side; out = pad(x) + 1
  ishp = (n - 2, m - 2)
  pst = ShapeTracker.from_shape(ishp).pad(((1, 1), (1, 1)))
  cases.append(_case("pad", kernel(store(alu(BinaryOps.ADD, buf(1, shp, st=pst), const(1.0, shp)))), [(0, shp, f)],
                     [(1, ishp, f)], lambda r: {1: _uniform(r, ishp)}, lambda x, v: {0: _f32(np.pad(x[1], 1) + 1.0)},
                     {"elementwise", "pad", "masked"}))
  a, b = buf(2, shp), buf(3, shp)
  cases.append(_case("two_outputs", kernel(store(alu(BinaryOps.ADD, a, b), 0), store(alu(BinaryOps.MUL, a, b), 1)),
                     [(0, shp, f), (1, shp, f)], [(2, shp, f), (3, shp, f)],
                     lambda r: {2: _uniform(r, shp), 3: _uniform(r, shp)},
                     lambda x, v: {0: _f32(x[2].astype(np.float64) + x[3]), 1: _f32(x[2].astype(np.float64) * x[3])},
                     {"elementwise", "multioutput"}))
  return cases

def _reductions(S: dict) -> list[Case]:
  f, cases = dtypes.float, []
  s3 = S["r3"]
  for ax in range(3):
    out = tuple(1 if i == ax else s for i, s in enumerate(s3))
    cases.append(_case(f"sum_axis{ax}", kernel(store(reduce(ReduceOps.SUM, buf(1, s3), (ax,)))), [(0, out, f)],
                       [(1, s3, f)], lambda r: {1: _uniform(r, s3)},
                       lambda x, v, ax=ax: {0: _f32(x[1].astype(np.float64).sum(ax, keepdims=True))}, {"reduce"}))
  sa = S["sum_all"]
  cases.append(_case("sum_all", kernel(store(reduce(ReduceOps.SUM, buf(1, sa), (0, 1)))), [(0, (1, 1), f)],
                     [(1, sa, f)], lambda r: {1: _uniform(r, sa)},
                     lambda x, v: {0: _f32(x[1].astype(np.float64).sum(keepdims=True))}, {"reduce"}))
  rw = S["rows"]
  cases.append(_case("max_axis1", kernel(store(reduce(ReduceOps.MAX, buf(1, rw), (1,)))), [(0, (rw[0], 1), f)],
                     [(1, rw, f)], lambda r: {1: _uniform(r, rw)}, lambda x, v: {0: x[1].max(1, keepdims=True)},
                     {"reduce", "max"}, tol=0.0))
  x = buf(1, rw)
  two = alu(BinaryOps.ADD, reduce(ReduceOps.SUM, x, (1,)), reduce(ReduceOps.MAX, x, (1,)))
  cases.append(_case("two_reduces", kernel(store(two)), [(0, (rw[0], 1), f)], [(1, rw, f)],
                     lambda r: {1: _uniform(r, rw)},
                     lambda x, v: {0: _f32(x[1].astype(np.float64).sum(1, keepdims=True) + x[1].max(1, keepdims=True))},
                     {"reduce", "multireduce"}))
  cases.append(_case("max_reduce_int", kernel(store(reduce(ReduceOps.MAX, buf(1, rw, dtypes.int32), (1,)))),
                     [(0, (rw[0], 1), dtypes.int32)], [(1, rw, dtypes.int32)],
                     lambda r: {1: _ints(r, rw, -(1 << 31), 1 << 31)}, lambda x, v: {0: x[1].max(1, keepdims=True)},
                     {"reduce", "max", "int"}, tol=0.0))
  return cases

def _matmul_ast(M: int, N: int, K: int, din: DType = dtypes.float, dout: Optional[DType] = None) -> LazyOp:
  """out[m, n] = sum_k A[m, k] * B[k, n] over the full shape (M, N, K); A is buffer 1 (M, K), B buffer 2 (K, N)."""
  a = buf(1, (M, N, K), din, st=view((M, N, K), (K, 0, 1)))
  b = buf(2, (M, N, K), din, st=view((M, N, K), (0, 1, N)))
  mul = alu(BinaryOps.MUL, a, b)
  return kernel(store(reduce(ReduceOps.SUM, cast(mul, dout) if dout is not None else mul, (2,))))

def _matmuls(S: dict) -> list[Case]:
  cases = []
  for name, (M, N, K) in S["matmul"].items():
    ref = lambda x, v, M=M, N=N: {0: _f32(x[1].astype(np.float64) @ x[2]).reshape(M, N, 1)}
    cases.append(_case(name, _matmul_ast(M, N, K), [(0, (M, N, 1), dtypes.float)],
                       [(1, (M, K), dtypes.float), (2, (K, N), dtypes.float)],
                       lambda r, M=M, N=N, K=K: {1: _uniform(r, (M, K)), 2: _uniform(r, (K, N))}, ref,
                       {"matmul", "reduce"}))
  cases += _lowp_matmuls(*S["matmul_lp"])
  N, K = S["matvec"]
  a, xv = buf(1, (N, K), st=view((N, K), (K, 1))), buf(2, (N, K), st=view((N, K), (0, 1)))
  cases.append(_case("matvec", kernel(store(reduce(ReduceOps.SUM, alu(BinaryOps.MUL, a, xv), (1,)))),
                     [(0, (N, 1), dtypes.float)], [(1, (N, K), dtypes.float), (2, (K,), dtypes.float)],
                     lambda r: {1: _uniform(r, (N, K)), 2: _uniform(r, (K,))},
                     lambda x, v: {0: _f32(x[1].astype(np.float64) @ x[2]).reshape(N, 1)}, {"matvec", "reduce"}))
  return cases

def _lowp_matmuls(M: int, N: int, K: int) -> list[Case]:
  """SUM(CAST(MUL(LOAD half, LOAD half), float)): the form the tensor cores match (half/bfloat16 in, float out)."""
  cases = []
  # quarter-integers in [-1, 1]: exact in half and bfloat16, and so are their products and float sums
  q = lambda r, s: (r.integers(-4, 5, size=s) * 0.25).astype(np.float32)
  cases.append(_case("matmul_half", _matmul_ast(M, N, K, dtypes.half, dtypes.float), [(0, (M, N, 1), dtypes.float)],
                     [(1, (M, K), dtypes.half), (2, (K, N), dtypes.half)],
                     lambda r: {1: q(r, (M, K)).astype(np.float16), 2: q(r, (K, N)).astype(np.float16)},
                     lambda x, v: {0: _f32(x[1].astype(np.float64) @ x[2].astype(np.float64)).reshape(M, N, 1)},
                     {"matmul", "reduce", "half", "tensor_core"}))
  cases.append(_case("matmul_bf16", _matmul_ast(M, N, K, dtypes.bfloat16, dtypes.float),
                     [(0, (M, N, 1), dtypes.float)], [(1, (M, K), dtypes.bfloat16), (2, (K, N), dtypes.bfloat16)],
                     lambda r: {1: f32_to_bf16(q(r, (M, K))), 2: f32_to_bf16(q(r, (K, N)))},
                     lambda x, v: {0: _f32(bf16_to_f32(x[1]).astype(np.float64) @ bf16_to_f32(x[2])).reshape(M, N, 1)},
                     {"matmul", "reduce", "bfloat16", "tensor_core"}))
  return cases

def conv2d_ast(N: int, CI: int, H: int, W: int, CO: int) -> LazyOp:
  """out[n, co, y, x] = sum_{ci, ky, kx} pad(inp)[n, ci, y+ky, x+kx] * w[co, ci, ky, kx], 3x3 with padding 1, over
  the full shape (N, CO, H, W, CI, 3, 3). The input is padded by a masked view, then read through a window view
  (a second View over the padded tensor whose y/ky and x/kx axes share a stride)."""
  Hp, Wp = H + 2, W + 2
  full = (N, CO, H, W, CI, 3, 3)
  padded = ShapeTracker.from_shape((N, CI, H, W)).pad(((0, 0), (0, 0), (1, 1), (1, 1)))
  window = View.create(full, (CI * Hp * Wp, 0, Wp, 1, Hp * Wp, Wp, 1))
  inp = buf(1, full, st=ShapeTracker(padded.views + (window,)))
  wgt = buf(2, full, st=view(full, (0, CI * 9, 0, 0, 9, 3, 1)))
  return kernel(store(reduce(ReduceOps.SUM, alu(BinaryOps.MUL, inp, wgt), (4, 5, 6))))

def conv2d_s2_ast(N: int, CI: int, H: int, W: int, CO: int) -> LazyOp:
  """conv2d_ast at stride 2: out[n, co, y, x] = sum pad(inp)[n, ci, 2y+ky, 2x+kx] * w[co, ci, ky, kx] over the full
  shape (N, CO, Ho, Wo, CI, 3, 3), Ho = (H - 1) // 2 + 1: the window view's output axes step 2 through the padded
  input, so no input is unit-stride along the output columns."""
  Hp, Wp, Ho, Wo = H + 2, W + 2, (H - 1) // 2 + 1, (W - 1) // 2 + 1
  full = (N, CO, Ho, Wo, CI, 3, 3)
  padded = ShapeTracker.from_shape((N, CI, H, W)).pad(((0, 0), (0, 0), (1, 1), (1, 1)))
  window = View.create(full, (CI * Hp * Wp, 0, 2 * Wp, 2, Hp * Wp, Wp, 1))
  inp = buf(1, full, st=ShapeTracker(padded.views + (window,)))
  wgt = buf(2, full, st=view(full, (0, CI * 9, 0, 0, 9, 3, 1)))
  return kernel(store(reduce(ReduceOps.SUM, alu(BinaryOps.MUL, inp, wgt), (4, 5, 6))))

def dwconv2d_ast(N: int, C: int, H: int, W: int) -> LazyOp:
  """A depthwise 3x3 conv with padding 1, out[n, c, y, x] = sum_{ky, kx} pad(inp)[n, c, y+ky, x+kx] * w[c, ky, kx],
  over the full shape (N, C, H, W, 3, 3): no output axis broadcasts the image (each channel reads its own)."""
  Hp, Wp = H + 2, W + 2
  full = (N, C, H, W, 3, 3)
  padded = ShapeTracker.from_shape((N, C, H, W)).pad(((0, 0), (0, 0), (1, 1), (1, 1)))
  window = View.create(full, (C * Hp * Wp, Hp * Wp, Wp, 1, Wp, 1))
  inp = buf(1, full, st=ShapeTracker(padded.views + (window,)))
  wgt = buf(2, full, st=view(full, (0, 9, 0, 0, 3, 1)))
  return kernel(store(reduce(ReduceOps.SUM, alu(BinaryOps.MUL, inp, wgt), (4, 5))))

def dwconv2d_numpy(x: np.ndarray, w: np.ndarray) -> np.ndarray:
  """dwconv2d_ast's result for x of shape (N, C, H, W) and w of (C, 3, 3), in float64, shaped (N, C, H, W)."""
  N, C, H, W = x.shape
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
  out = np.zeros((N, C, H, W))
  for ky in range(3):
    for kx in range(3): out += xp[:, :, ky:ky + H, kx:kx + W] * w[None, :, ky, kx, None, None]
  return out

def _conv2d_s2(S: dict) -> Case:
  N, CI, H, W, CO = S["conv_s2"]
  Ho, Wo = (H - 1) // 2 + 1, (W - 1) // 2 + 1
  def ref(x: dict, v: dict) -> dict:
    xp = np.pad(x[1].astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((N, CO, Ho, Wo))
    for ky in range(3):
      for kx in range(3):
        out += np.einsum("nchw,oc->nohw", xp[:, :, ky:ky + 2 * Ho:2, kx:kx + 2 * Wo:2], x[2][:, :, ky, kx])
    return {0: _f32(out).reshape(N, CO, Ho, Wo, 1, 1, 1)}
  return _case("conv2d_s2", conv2d_s2_ast(N, CI, H, W, CO), [(0, (N, CO, Ho, Wo, 1, 1, 1), dtypes.float)],
               [(1, (N, CI, H, W), dtypes.float), (2, (CO, CI, 3, 3), dtypes.float)],
               lambda r: {1: _uniform(r, (N, CI, H, W)), 2: _uniform(r, (CO, CI, 3, 3))}, ref,
               {"conv", "reduce", "pad"})

def _conv2d(S: dict) -> Case:
  N, CI, H, W, CO = S["conv"]
  ast = conv2d_ast(N, CI, H, W, CO)
  def ref(x: dict, v: dict) -> dict:
    xp = np.pad(x[1].astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((N, CO, H, W))
    for ky in range(3):
      for kx in range(3): out += np.einsum("nchw,oc->nohw", xp[:, :, ky:ky + H, kx:kx + W], x[2][:, :, ky, kx])
    return {0: _f32(out).reshape(N, CO, H, W, 1, 1, 1)}
  return _case("conv2d", ast, [(0, (N, CO, H, W, 1, 1, 1), dtypes.float)],
               [(1, (N, CI, H, W), dtypes.float), (2, (CO, CI, 3, 3), dtypes.float)],
               lambda r: {1: _uniform(r, (N, CI, H, W)), 2: _uniform(r, (CO, CI, 3, 3))}, ref,
               {"conv", "reduce", "pad"})

def _images(S: dict) -> list[Case]:
  H, W = S["image"]
  shp, img, f = (H, W, 4), dtypes.imagef((H, W, 4)), dtypes.float
  return [
    _case("image_in", kernel(store(alu(BinaryOps.MUL, buf(1, shp, img), const(2.0, shp)))), [(0, shp, f)],
          [(1, shp, img)], lambda r: {1: _uniform(r, shp)}, lambda x, v: {0: x[1] * np.float32(2.0)}, {"image"}),
    _case("image_out", kernel(store(alu(BinaryOps.ADD, buf(1, shp), buf(2, shp)), 0, dtype=img)), [(0, shp, img)],
          [(1, shp, f), (2, shp, f)], lambda r: {1: _uniform(r, shp), 2: _uniform(r, shp)},
          lambda x, v: {0: _f32(x[1].astype(np.float64) + x[2])}, {"image"}),
  ]

def _symbolic(S: dict) -> list[Case]:
  lim, m = S["sym"]
  n = Variable("n", 1, lim)
  vv = ({"n": 1}, {"n": 17}, {"n": lim})
  shp, mx, f = (n, m), (lim, m), dtypes.float
  add = _case("sym_add", kernel(store(alu(BinaryOps.ADD, buf(1, shp), buf(2, shp)))), [(0, mx, f)],
              [(1, mx, f), (2, mx, f)],
              lambda r: {1: _uniform(r, mx), 2: _uniform(r, mx)},
              lambda x, v: {0: _f32(x[1][:v["n"]].astype(np.float64) + x[2][:v["n"]])}, {"symbolic", "elementwise"},
              var_vals=vv)
  rshp, rmx = (m, n), (m, lim)
  def sum_ref(x: dict, v: dict) -> dict:
    k = v["n"]
    return {0: _f32(x[1].reshape(-1)[:m * k].reshape(m, k).astype(np.float64).sum(1, keepdims=True))}
  red = _case("sym_sum", kernel(store(reduce(ReduceOps.SUM, buf(1, rshp), (1,)))), [(0, (m, 1), f)], [(1, rmx, f)],
              lambda r: {1: _uniform(r, rmx)}, sum_ref, {"symbolic", "reduce"}, var_vals=vv)
  return [add, red]

def _wrap32(x: np.ndarray) -> np.ndarray:
  return (np.asarray(x, dtype=np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)

def _trunc_divmod(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """C-style IDIV/MOD in int64: truncate toward zero, 0 for a zero divisor, then wrap to int32."""
  a64, b64 = a.astype(np.int64), b.astype(np.int64)
  safe = np.where(b64 == 0, 1, b64)
  q = np.where(b64 == 0, 0, np.sign(a64) * np.sign(safe) * (np.abs(a64) // np.abs(safe)))
  r = np.where(b64 == 0, 0, a64 - safe * q)
  return _wrap32(q), _wrap32(r)

def _exec_extras(S: dict) -> list[Case]:
  shp = S["ew"]
  i32, f, cases = dtypes.int32, dtypes.float, []
  a, b, c = buf(1, shp, i32), buf(2, shp, i32), buf(3, shp, i32)
  t = alu(BinaryOps.MUL, alu(BinaryOps.ADD, a, b), a)
  t = alu(BinaryOps.AND, alu(BinaryOps.XOR, t, b), alu(BinaryOps.OR, a, b))
  t = alu(BinaryOps.SHR, alu(BinaryOps.MAX, alu(BinaryOps.SHL, t, c), b), const(3, shp, i32))
  def int_ref(x: dict, v: dict) -> dict:
    a, b, c = (x[i].astype(np.int64) for i in (1, 2, 3))
    t = _wrap32((a + b) * a).astype(np.int64)
    t = (t ^ b) & (a | b)
    t = _wrap32(t << (c % 32)).astype(np.int64)
    return {0: _wrap32(np.where(t > b, t, b) >> 3)}
  cases.append(_case("int_ops", kernel(store(t)), [(0, shp, i32)], [(1, shp, i32), (2, shp, i32), (3, shp, i32)],
                     lambda r: {1: _ints(r, shp, -3000, 3000), 2: _ints(r, shp, -3000, 3000), 3: _ints(r, shp, 0, 40)},
                     int_ref, {"int", "elementwise"}, tol=0.0))
  x, y = buf(1, shp), buf(2, shp)
  w = alu(TernaryOps.WHERE, alu(BinaryOps.CMPLT, x, y), x, alu(BinaryOps.MUL, y, const(2.0, shp)))
  cases.append(_case("bool_where", kernel(store(w)), [(0, shp, f)], [(1, shp, f), (2, shp, f)],
                     lambda r: {1: _uniform(r, shp), 2: _uniform(r, shp)},
                     lambda x, v: {0: np.where(x[1] < x[2], x[1], x[2] * np.float32(2))}, {"bool", "elementwise"},
                     tol=0.0))
  e = alu(BinaryOps.ADD, alu(UnaryOps.EXP2, buf(1, shp)), alu(UnaryOps.LOG2, buf(2, shp)))
  cases.append(_case("exp2_log2", kernel(store(e)), [(0, shp, f)], [(1, shp, f), (2, shp, f)],
                     lambda r: {1: _uniform(r, shp, -4, 4), 2: _uniform(r, shp, 0.125, 8)},
                     lambda x, v: {0: _f32(np.exp2(x[1].astype(np.float64)) + np.log2(x[2].astype(np.float64)))},
                     {"transcendental", "elementwise"}))
  cases.append(_casts(shp))
  def idiv_gen(r: np.random.Generator) -> dict:
    a, b = _ints(r, shp, -1000, 1000), _ints(r, shp, -9, 10)
    # INT_MIN / -1 wraps, x / 0 and x % 0 give 0, negative operands truncate toward zero
    a.flat[:4] = [-(1 << 31), -(1 << 31), 7, -7]
    b.flat[:4] = [-1, 0, 0, 2]
    return {2: a, 3: b}
  cases.append(_idiv_case(shp, idiv_gen))
  return cases

def _idiv_case(shp: tuple, gen: Callable) -> Case:
  i32 = dtypes.int32
  q, m = buf(2, shp, i32), buf(3, shp, i32)
  def ref(x: dict, v: dict) -> dict:
    d, r = _trunc_divmod(x[2], x[3])
    return {0: d, 1: r}
  return _case("idiv_mod", kernel(store(alu(BinaryOps.IDIV, q, m), 0), store(alu(BinaryOps.MOD, q, m), 1)),
               [(0, shp, i32), (1, shp, i32)], [(2, shp, i32), (3, shp, i32)],
               gen, ref, {"int", "elementwise"}, tol=0.0)

def _casts(shp: tuple) -> Case:
  """Outputs 0..6: float->int32, int32->float, float->half, half->float, bool->int32, bitcast float->int32,
  bitcast(bitcast(f, int32) + 1, float). Inputs: 7 float, 8 int32, 9 half, 10 bool."""
  f, i32, h = dtypes.float, dtypes.int32, dtypes.half
  fx, ix, hx, bx = buf(7, shp, f), buf(8, shp, i32), buf(9, shp, h), buf(10, shp, dtypes.bool)
  outs = [cast(fx, i32), cast(ix, f), cast(fx, h), cast(hx, f), cast(bx, i32), bitcast(fx, i32),
          bitcast(alu(BinaryOps.ADD, bitcast(fx, i32), const(1, shp, i32)), f)]
  ast = kernel(*(store(o, i) for i, o in enumerate(outs)))
  def ref(x: dict, v: dict) -> dict:
    fv = x[7]
    return {0: np.trunc(fv).astype(np.int32), 1: x[8].astype(np.float32), 2: fv.astype(np.float16),
            3: x[9].astype(np.float32), 4: x[10].astype(np.int32), 5: fv.view(np.int32),
            6: (fv.view(np.int32) + np.int32(1)).view(np.float32)}
  gen = lambda r: {7: _uniform(r, shp, -100, 100), 8: _ints(r, shp, -(1 << 24), 1 << 24),
                   9: _uniform(r, shp, -100, 100, np.float16), 10: r.integers(0, 2, size=shp).astype(np.bool_)}
  return _case("casts", ast, [(i, shp, o.dtype) for i, o in enumerate(outs)],
               [(7, shp, f), (8, shp, i32), (9, shp, h), (10, shp, dtypes.bool)], gen, ref, {"cast", "half", "int"},
               tol=0.0)

# sizes: "small" keeps each heuristic branch alive (see the module docstring of each builder); "large" is realistic
_SIZES: dict[str, dict[str, Any]] = {
  # ew: 1280 outputs >= 1024 (upcast loop); r3: 16-divisible reduce dims, <= 2048 outputs (GROUPTOP 16);
  # sum_all: 1 output, 4096-long reduce (GROUPTOP 256); matvec: K % 8 == 0 and N % 16 == 0
  "small": {"ew": (32, 40), "r3": (16, 16, 16), "sum_all": (64, 64), "rows": (32, 64),
            "matmul": {"matmul_64": (64, 64, 64), "matmul_512": (32, 32, 32), "matmul_1024": (16, 16, 256),
                       "matmul_odd": (100, 37, 53), "matmul_skinny": (16, 10, 48),
                       "matmul_pad": (12, 255, 20)},
            "matmul_lp": (32, 32, 32), "matvec": (64, 64), "conv": (1, 4, 8, 8, 8), "conv_s2": (1, 4, 16, 16, 8),
            "image": (8, 8), "sym": (64, 16)},
  "large": {"ew": (1024, 1024), "r3": (64, 256, 256), "sum_all": (1024, 1024), "rows": (1024, 1024),
            "matmul": {"matmul_64": (64, 64, 64), "matmul_512": (512, 512, 512), "matmul_1024": (1024, 1024, 1024),
                       "matmul_odd": (100, 37, 53), "matmul_skinny": (64, 10, 256),
                       "matmul_pad": (1000, 999, 1000)},
            "matmul_lp": (1024, 1024, 1024), "matvec": (4096, 4096), "conv": (8, 64, 32, 32, 64),
            "conv_s2": (8, 16, 64, 64, 32), "image": (64, 128), "sym": (1024, 256)},
}

@functools.lru_cache(maxsize=None)
def _build(scale: str) -> tuple[Case, ...]:
  if scale not in _SIZES: raise ValueError(f"unknown catalogue scale {scale!r}; use 'small' or 'large'")
  S = _SIZES[scale]
  cases = _elementwise(S) + _reductions(S) + _matmuls(S) + [_conv2d(S), _conv2d_s2(S)] + _images(S) + _symbolic(S) + \
    _exec_extras(S)
  return tuple(cases)

def catalogue(scale: str = "small") -> list[Case]:
  """Every case at `scale` ("small" for execution, "large" for Kernel tests that run nothing)."""
  return list(_build(scale))

def run_program(dev: Any, case: Case, prg: Any, seed: int) -> list[tuple[dict, dict, dict]]:
  """prg (for case) compiled on dev and run on seeded inputs at each of case.var_vals: [(var_vals, outputs,
  references)], outputs and references flat by buffer index, each output cut to its reference's size (a symbolic
  case defines only a prefix of its buffers)."""
  from kernopt.runtime import Buffer
  runner, ins, ret = dev.compile(prg), case.inputs(np.random.default_rng(seed)), []
  for vv in case.var_vals:
    bufs = {b.idx: Buffer(dev.name, b.numel, b.dtype) for b in case.buffers}
    for b in case.buffers:
      if not b.output: bufs[b.idx].copyin(ins[b.idx])
    runner(*[bufs[i] for i in sorted(bufs)], var_vals=vv)
    ref = {i: np.asarray(r).reshape(-1) for i, r in case.reference(ins, vv).items()}
    ret.append((vv, {b.idx: bufs[b.idx].numpy()[:ref[b.idx].size] for b in case.outputs}, ref))
  return ret

def get(name: str, scale: str = "small") -> Case:
  """The case called `name` at `scale`."""
  for c in _build(scale):
    if c.name == name: return c
  raise KeyError(f"no catalogue case {name!r}; have {[c.name for c in _build(scale)]}")

def protocol_program(name: str, renderer: Any) -> tuple[Any, bool]:
  """(Program, whether tensor cores applied) of the small case `name` under the standard protocol for `renderer`
  (render only: nothing is compiled)."""
  from kernopt.kernel import Kernel
  k = Kernel(get(name).ast, opts=renderer).required_optimizations()
  tc = k.apply_tensor_cores()
  if not tc: k.hand_coded_optimizations()
  return k.to_program(), tc
