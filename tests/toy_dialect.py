"""A toy dialect in one file, as a new dialect is added: a Renderer subclass whose record declares what it can do and
whose render() spells a linearized UOp list as the source of a Python function over numpy arrays, its registration
(`get_renderer("TOY")`), and a runner that exec()s that source (our own rendered code, in tests only) on numpy buffers.

The function takes the used buffers (flat numpy arrays of their storage types, in index order) and the Variables as
keyword arguments `var_<name>`. Each non-reduce RANGE is one broadcast axis of numpy index arrays, so the whole
output grid is computed at once; each reduce RANGE is a Python `for` loop. Values are numpy arrays of the UOp's
dtype (half as float16, whose ops round each result as the op table says; bfloat16 as float32 rounded after each op,
stored as uint16 bits); every LOAD and STORE is bounds-checked on the lanes it reads or writes."""
from __future__ import annotations
import inspect
from typing import Any, Callable
import numpy as np
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.errors import UnsupportedError
from kernopt.ops import BinaryOps, TernaryOps, UnaryOps
from kernopt.renderers import Capabilities, Program, Renderer, register_dialect
from kernopt.uops import UOp, UOps

_NP = {dtypes.bool: "np.bool_", dtypes.int8: "np.int8", dtypes.uint8: "np.uint8", dtypes.int16: "np.int16",
       dtypes.uint16: "np.uint16", dtypes.int32: "np.int32", dtypes.uint32: "np.uint32", dtypes.int64: "np.int64",
       dtypes.uint64: "np.uint64", dtypes.half: "np.float16", dtypes.bfloat16: "np.float32",
       dtypes.float32: "np.float32", dtypes.float64: "np.float64"}
_INFIX = {BinaryOps.ADD: "+", BinaryOps.MUL: "*", BinaryOps.CMPLT: "<", BinaryOps.CMPNE: "!=", BinaryOps.XOR: "^",
          BinaryOps.AND: "&", BinaryOps.OR: "|"}
_CALL = {UnaryOps.EXP2: "np.exp2", UnaryOps.LOG2: "np.log2", UnaryOps.SIN: "np.sin", UnaryOps.SQRT: "np.sqrt",
         BinaryOps.MAX: "_max", BinaryOps.IDIV: "_idiv", BinaryOps.MOD: "_mod", BinaryOps.SHL: "_shl",
         BinaryOps.SHR: "_shr", TernaryOps.WHERE: "np.where"}

class ToyRenderer(Renderer):
  """Python/numpy source: loops only (no workgroups, no shared memory, no images, no tensor cores), scalar loads."""
  caps = Capabilities(device="TOY", has_local=False, has_shared=False, supports_float4=False, global_max=None)

  def render(self, name: str, uops: list[UOp]) -> str:
    num = {u: i for i, u in enumerate(uops)}
    axes = [u for u in uops if u.op is UOps.RANGE and not u.arg[1]]
    r: dict[UOp, str] = {}
    bufs: list[tuple[int, str]] = []
    params: list[str] = []
    body: list[str] = []
    depth, masks = 1, ["True"]
    def line(s: str) -> None: body.append("  " * depth + s)
    def both(a: str, b: str) -> str: return b if a == "True" else a if b == "True" else f"({a} & {b})"
    for u in uops:
      v = r[u] = f"v{num[u]}"
      src = [r.get(s, "") for s in u.src]   # (an accumulator names its reduce RANGEs before they open)
      if u.op is UOps.DEFINE_GLOBAL:
        if isinstance(u.dtype, ImageDType): raise UnsupportedError(f"the toy dialect has no images: {u.dtype}")
        r[u] = u.arg[1]
        bufs.append((u.arg[0], u.arg[1]))
      elif u.op is UOps.DEFINE_VAR:
        params.append(f"var_{u.arg.expr}")
        line(f"{v} = {_NP[u.dtype]}(var_{u.arg.expr})")
      elif u.op is UOps.CONST: line(f"{v} = {self.const(u.arg, u.dtype)}")
      elif u.op is UOps.RANGE and not u.arg[1]:
        if depth > 1: raise UnsupportedError("the toy dialect needs every non-reduce loop outside the reduce loops")
        line(f"{v} = _axis({src[0]}, {src[1]}, {_NP[u.dtype]}, {axes.index(u)}, {len(axes)})")
      elif u.op is UOps.RANGE:
        line(f"for {v} in np.arange({src[0]}, {src[1]}, dtype={_NP[u.dtype]}):")
        depth += 1
      elif u.op is UOps.ENDRANGE:
        if u.src[0].arg[1]: depth -= 1
      elif u.op is UOps.IF:
        line(f"{v} = {both(masks[-1], src[0])}")
        masks.append(v)
      elif u.op is UOps.ENDIF: masks.pop()
      elif u.op is UOps.DEFINE_ACC: line(f"{v} = {self.const(u.arg[0], u.dtype)}")
      elif u.op is UOps.PHI:
        line(f"{src[0]} = {src[1]}")
        r[u] = src[0]
      elif u.op is UOps.LOAD:
        gate, alt = (src[2], src[3]) if len(src) >= 4 else ("True", "0")
        line(f"{v} = _ld({src[0]}, {src[1]}, {both(masks[-1], gate)}, {alt}, {self.bf16(u.src[0].dtype)})")
      elif u.op is UOps.STORE:
        gate = src[3] if len(src) >= 4 else "True"
        line(f"_st({src[0]}, {src[1]}, {src[2]}, {both(masks[-1], gate)}, {self.bf16(u.src[0].dtype)})")
      elif u.op is UOps.ALU: line(f"{v} = {self.alu(u, src)}")
      elif u.op is UOps.CAST: line(f"{v} = _cast({src[0]}, {_NP[u.dtype]}, {self.bf16(u.dtype)})")
      elif u.op is UOps.BITCAST and dtypes.bfloat16 not in (u.dtype, u.src[0].dtype):
        line(f"{v} = np.asarray({src[0]}).view({_NP[u.dtype]})")
      else: raise UnsupportedError(f"the toy dialect can't spell {u.op.name} ({u.dtype})")
    args = [b for _, b in sorted(bufs)] + (["*"] + sorted(params) if params else [])
    return "\n".join([f"def {name}({', '.join(args)}):", *body, "  return None"])

  def bf16(self, dt: Any) -> bool: return dt is not None and dt.scalar() == dtypes.bfloat16

  def const(self, val: Any, dt: DType) -> str:
    if dtypes.is_float(dt): return f"_round({_NP[dt]}(float.fromhex({float(val).hex()!r})), {self.bf16(dt)})"
    return f"{_NP[dt]}({int(val)!r})" if dt != dtypes.bool else f"np.bool_({bool(val)})"

  def alu(self, u: UOp, src: list[str]) -> str:
    op, dt = u.arg, u.src[-1].dtype
    if op in _INFIX: ret = f"({src[0]} {_INFIX[op]} {src[1]})"
    elif op is UnaryOps.NEG: ret = f"(~{src[0]})" if dt == dtypes.bool else f"(-{src[0]})"
    elif op is UnaryOps.RECIP: ret = f"_idiv({_NP[dt]}(1), {src[0]})"
    elif op is TernaryOps.MULACC: ret = f"_round({src[0]} * {src[1]}, {self.bf16(dt)}) + {src[2]}"
    elif op in _CALL: ret = f"{_CALL[op]}({', '.join(src)})"
    else: raise UnsupportedError(f"the toy dialect can't spell {op}")
    return f"_round({ret}, True)" if self.bf16(u.dtype) else ret

register_dialect("TOY", ToyRenderer)

# ***** what the rendered source calls: the toy target's runtime library *****

def _axis(start: Any, end: Any, dt: Any, axis: int, naxes: int) -> np.ndarray:
  """A non-reduce loop's indices as broadcast axis `axis` of `naxes`."""
  return np.arange(start, end, dtype=dt).reshape((1,) * axis + (-1,) + (1,) * (naxes - axis - 1))

def _round(x: Any, bf16: bool) -> Any:
  """x rounded to bfloat16 (nearest even, held in float32) when bf16; else x."""
  if not bf16: return x
  bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
  rounded = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
  return np.where(np.isnan(x), np.float32(np.nan), rounded)

def _check(buf: np.ndarray, idx: np.ndarray, mask: np.ndarray) -> None:
  if np.any(mask & ((idx < 0) | (idx >= buf.size))):
    bad = idx[mask & ((idx < 0) | (idx >= buf.size))]
    raise IndexError(f"index {int(bad.flat[0])} outside a buffer of {buf.size} elements")

def _ld(buf: np.ndarray, idx: Any, mask: Any, alt: Any, bf16: bool) -> Any:
  idx, mask = np.broadcast_arrays(np.asarray(idx), np.asarray(mask))
  _check(buf, idx, mask)
  val = buf[np.where(mask, idx, 0)] if buf.size else np.zeros(idx.shape, buf.dtype)
  if bf16: val = (val.astype(np.uint32) << 16).view(np.float32)
  return np.where(mask, val, np.asarray(alt, dtype=val.dtype))

def _st(buf: np.ndarray, idx: Any, val: Any, mask: Any, bf16: bool) -> None:
  idx, val, mask = np.broadcast_arrays(np.asarray(idx), np.asarray(val), np.asarray(mask))
  _check(buf, idx, mask)
  if bf16: val = (np.asarray(_round(val, True), dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
  buf[idx[mask]] = val[mask]

def _cast(x: Any, dt: Any, bf16: bool) -> Any:
  x = np.asarray(x)
  if dt is np.bool_: return x != 0
  if np.issubdtype(dt, np.integer) and np.issubdtype(x.dtype, np.floating):
    info, wide = np.iinfo(dt), x.astype(np.float64)   # out of range (unspecified by the op table) gives 0, as C does
    ok = (wide > float(info.min) - 1) & (wide < float(info.max) + 1)
    return np.where(ok, x, 0).astype(dt)
  return _round(x.astype(dt), bf16)

def _max(a: Any, b: Any) -> Any: return np.where(a > b, a, b)

def _idiv(a: Any, b: Any) -> Any:
  """Floats: true division. Ints: truncated toward zero, 0 on a zero divisor, wrapping (MIN / -1 is MIN)."""
  a, b = np.asarray(a), np.asarray(b)
  if np.issubdtype(a.dtype, np.floating): return a / b
  safe = np.where(b == 0, 1, b).astype(b.dtype)
  q = np.where((a < 0) != (safe < 0), -(np.abs(a.astype(np.int64)) // np.abs(safe.astype(np.int64))),
               np.abs(a.astype(np.int64)) // np.abs(safe.astype(np.int64)))
  return np.where(b == 0, 0, q).astype(a.dtype)

def _mod(a: Any, b: Any) -> Any:
  """Floats: C's fmod (0 on a zero divisor). Ints: the dividend's sign, 0 on a zero divisor."""
  a, b = np.asarray(a), np.asarray(b)
  if np.issubdtype(a.dtype, np.floating): return np.where(b == 0, np.zeros_like(a), np.fmod(a, b))
  return np.where(b == 0, 0, a - b * _idiv(a, b)).astype(a.dtype)

def _shl(a: Any, b: Any) -> Any: return np.left_shift(a, np.asarray(b) % (8 * np.asarray(a).itemsize))
def _shr(a: Any, b: Any) -> Any: return np.right_shift(a, np.asarray(b) % (8 * np.asarray(a).itemsize))

_RUNTIME = {"np": np, "_axis": _axis, "_round": _round, "_ld": _ld, "_st": _st, "_cast": _cast, "_max": _max,
            "_idiv": _idiv, "_mod": _mod, "_shl": _shl, "_shr": _shr}

def compile_toy(prg: Program) -> Callable[..., None]:
  """The function prg.src defines (exec of our own rendered source, with the toy runtime in its globals)."""
  scope: dict[str, Any] = dict(_RUNTIME)
  exec(compile(prg.src, f"<toy {prg.name}>", "exec"), scope)
  return scope[prg.name]

def run_toy(prg: Program, buffers: dict[int, np.ndarray], var_vals: dict[str, int]) -> None:
  """Run prg on buffers (flat numpy arrays by MemBuffer index, in their storage types), writing its outputs."""
  fn = compile_toy(prg)
  names = inspect.signature(fn).parameters   # the Variables the source still uses
  with np.errstate(all="ignore"):   # ints wrap and floats reach inf/nan as the op table says
    fn(*[buffers[a.idx] for a in prg.used_args], **{f"var_{k}": v for k, v in var_vals.items() if f"var_{k}" in names})
