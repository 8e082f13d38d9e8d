"""The lowerer's float4 accesses, for the GPU dialects whose capabilities say supports_float4 or supports_images:
unit-stride float/half lanes fold into aligned float4/float2 loads and stores (read back lane by lane with GEPs),
and image buffers move float4 texels at int2 coordinates. `Float4Lanes` is the lowerer's part that does it.
Imports dtype, errors, lower_index, ops, shape/ and uops."""
from __future__ import annotations
from typing import TYPE_CHECKING, Any, Callable, Optional
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.errors import UnsupportedError
from kernopt.lower_index import I32, alu, divisible, linear
from kernopt.ops import BinaryOps, LazyOp, MemBuffer, TernaryOps
from kernopt.shape.symbolic import Node, Variable
from kernopt.uops import UOp, UOps

class Float4Lanes:
  """The float4 and image accesses of `kernopt.lowerer._Lowerer` (which sets these attributes)."""
  opts: Any
  idx_dt: DType
  lanes: list[tuple[int, ...]]
  lane_of: dict[tuple[int, ...], int]
  up_sizes: tuple[int, ...]
  up_vars: dict[Variable, int]
  if TYPE_CHECKING:
    per_lane: Callable[..., list[UOp]]
    const: Callable[[int], UOp]

  def _vector_axis(self, mb: MemBuffer, idx: Node, valid: Node) -> Optional[tuple[int, int]]:
    """(upcast axis j, width) along which this buffer's lanes fold into aligned vector accesses, if any."""
    if not self.opts.caps.supports_float4 or mb.idx < 0 or mb.dtype not in (dtypes.float, dtypes.half) or \
       not self.lanes: return None
    return self._fold_axis(idx, valid, (4, 2))

  def _fold_axis(self, idx: Node, valid: Node, widths: tuple[int, ...]) -> Optional[tuple[int, int]]:
    """(upcast axis j, width w): idx = base + u_j + (multiples of w) with base a multiple of w, and valid
    independent of u_j, so w consecutive lanes along j are one aligned access."""
    if (lin := linear(idx, self.up_vars)) is None: return None
    base, strides = lin
    valid_vars = valid.vars()
    for j in sorted(strides, reverse=True):
      if strides[j] != 1 or any(v in valid_vars for v, k in self.up_vars.items() if k == j): continue
      for w in widths:
        if self.up_sizes[j] % w == 0 and divisible(base, w) and all(s % w == 0 for k, s in strides.items() if k != j):
          return j, w
    return None

  def _texels(self, img: ImageDType, idx: Node) -> list[UOp]:
    """The int2 texel coordinate (x, y) of each lane's element idx of an (H, W, 4) image."""
    w = img.shape[1]
    xs, ys = self.per_lane((idx // 4) % w), self.per_lane(idx // (4 * w))
    if self.idx_dt is not I32: xs, ys = [x.cast(I32) for x in xs], [y.cast(I32) for y in ys]   # small: images
    return [UOp(UOps.VECTORIZE, I32.vec(2), (x, y)) for x, y in zip(xs, ys)]

  def _groups(self, j: int, w: int) -> list[tuple[int, list[int]]]:
    """(first lane, lanes) of each aligned vector along upcast axis j."""
    out = []
    for i, ln in enumerate(self.lanes):
      if ln[j] % w == 0: out.append((i, [self.lane_of[ln[:j] + (ln[j] + t,) + ln[j + 1:]] for t in range(w)]))
    return out

  def _image_load(self, img: ImageDType, buf: UOp, idx: Node, valid: Node) -> list[UOp]:
    """Each lane's element of a float4 texel: one texel per 4 lanes along a unit-stride upcast axis, else a texel
    per lane and its component idx % 4 (a GEP when constant, else a WHERE chain)."""
    texels, valids = self._texels(img, idx), self.per_lane(valid, True)
    f, f4 = dtypes.float, dtypes.float.vec(4)
    vzero = UOp(UOps.VECTORIZE, f4, (UOp.const(f, 0.0),) * 4)
    def fetch(xy: UOp, v: UOp) -> UOp:
      if v.op is UOps.CONST: return UOp(UOps.LOAD, f4, (buf, xy)) if v.arg else vzero
      return UOp(UOps.LOAD, f4, (buf, xy, v, vzero))
    if (vec := self._fold_axis(idx, valid, (4,))) is not None:
      out: list[UOp] = [vzero] * len(self.lanes)
      for first, members in self._groups(vec[0], 4):
        t = fetch(texels[first], valids[first])
        for k, m in enumerate(members): out[m] = UOp(UOps.GEP, f, (t,), k)
      return out
    out = []
    for xy, v, comp in zip(texels, valids, self.per_lane(idx % 4)):
      t = fetch(xy, v)
      if comp.op is UOps.CONST: out.append(UOp(UOps.GEP, f, (t,), comp.arg))
      else:
        sel = UOp(UOps.GEP, f, (t,), 3)
        for k in (2, 1, 0):
          sel = alu(TernaryOps.WHERE, f, alu(BinaryOps.CMPLT, dtypes.bool, comp, self.const(k + 1)),
                    UOp(UOps.GEP, f, (t,), k), sel)
        out.append(sel)
    return out

  def _image_store(self, x: LazyOp, buf: UOp, idx: Node, valid: Node, vals: list[UOp], valids: list[UOp]) -> list[UOp]:
    """float4 texel stores: 4 lanes along a unit-stride upcast axis (Kernel.required_optimizations upcasts it)."""
    img: ImageDType = x.arg.dtype
    if (vec := self._fold_axis(idx, valid, (4,))) is None:
      raise UnsupportedError(f"a store into {img} needs 4 upcast lanes along a unit-stride axis, "
                             f"upcast sizes {self.up_sizes}")
    texels, f = self._texels(img, idx), dtypes.float
    out = []
    for first, members in self._groups(vec[0], 4):
      val = UOp(UOps.VECTORIZE, f.vec(4), tuple(vals[m].cast(f) for m in members))
      v = valids[first]
      if v.op is not UOps.CONST: out.append(UOp(UOps.STORE, None, (buf, texels[first], val, v)))
      elif v.arg: out.append(UOp(UOps.STORE, None, (buf, texels[first], val)))
    return out

__all__ = ["Float4Lanes"]
