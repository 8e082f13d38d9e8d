"""kernopt's float32 exp2 as C source: one static inline function on a float or a GCC vector of floats, the same bits
in every lane width (so packing lanes never changes a result), within 1 ulp of the correctly rounded exp2. x86 builds
take the ISA's min/max, vscalefps and vreduceps through the compiler's builtins where the width has them, each with
the portable spelling as fallback. Imports only the standard library."""
from __future__ import annotations
import functools
from typing import Optional

# 2^f on [-0.5, 0.5] (least squares on relative error, degree 6), constant term first: with the exact scaling below,
# within 1 ulp of the correctly rounded exp2 on every float32 tested (tests/test_native_profile.py), fused or not
_EXP2_COEFFS = ("1.0f", "0.693147182f", "0.240226492f", "0.0555034243f", "0.00961836521f", "0.00133946899f",
                "0.000153633708f")

def _exp2_poly(fma: Optional[str], ft: str) -> str:
  """_EXP2_COEFFS at f by Horner's rule: c0 + f * (c1 + f * (...)) as multiplies and adds, or, given `fma` (the name
  of a fused a*b + c on ft), one fma per step: one rounding each, and a dependency chain half as long (the
  reference's softmax exp kernel, 1 thread, Zen 3: 1.2x)."""
  if fma is None:
    return " + f * (".join(_EXP2_COEFFS[:-1]) + f" + f * {_EXP2_COEFFS[-1]}" + ")" * (len(_EXP2_COEFFS) - 2)
  acc = f"({ft}){{0}} + {_EXP2_COEFFS[-1]}" if ft != "float" else _EXP2_COEFFS[-1]
  for c in reversed(_EXP2_COEFFS[:-1]):
    acc = f"{fma}({acc}, f, {c if ft == 'float' else f'({ft}){{0}} + {c}'})"
  return acc

@functools.lru_cache(None)
def exp2_helper(name: str, ft: str, it: str, n: int, fma: Optional[str] = None) -> str:
  """kernopt's float32 exp2, `name`(x) on ft (float, or a vector of n floats; it: the int type of as many lanes):
  x clamped to [-151, 129] (NaN kept), r = x rounded to nearest even by the 1.5 * 2^23 trick, 2^(x - r) by
  _exp2_poly(fma), times 2^r as two exact powers of two (so results that underflow round once). Branch-free, so the
  vector version is the scalar one lane by lane (with fmaf and a lane-wise fma alike) and packing never changes a
  result; libm's exp2f is a call per lane."""
  if n == 1:
    return "\n".join([
      f"static inline float {name}(float x) {{",
      "  float c = x < -151.0f ? -151.0f : (x > 129.0f ? 129.0f : x), z = c != c ? 0.0f : c;",
      "  float r = (z + 12582912.0f) - 12582912.0f, f = c - r;",
      "  int32_t n = (int32_t)r, h = n / 2;",
      f"  float p = {_exp2_poly(fma, ft)};",
      "  union { int32_t i; float f; } s1 = { .i = (h + 127) << 23 }, s2 = { .i = (n - h + 127) << 23 };",
      "  return (p * s1.f) * s2.f;", "}"])
  masked = [f"  {it} lo = x < -151.0f, hi = x > 129.0f;",
            f"  {ft} c = ({ft})((lo & ({it})(({ft}){{0}} - 151.0f)) | (hi & ({it})(({ft}){{0}} + 129.0f)) | "
            f"(~(lo | hi) & ({it})x));"]
  if n in _MINMAX:
    # x86's max(a, b) is b when either is NaN: max(-151, x), then min(129, .), keep a NaN x (2 ops instead of 7)
    mn, mx, isa = _MINMAX[n]
    hi = mn.format(a=f"({ft}){{0}} + 129.0f", b=mx.format(a=f"({ft}){{0}} - 151.0f", b="x"))
    masked = [f"#if defined(__x86_64__) && defined({isa})", f"  {ft} c = {hi};", "#else", *masked, "#endif"]
  # h = floor(n / 2) by a shift where the scalar truncates: either split keeps p * 2^h a normal float, so the one
  # rounding of (p * 2^h) * 2^(n-h) gives the same bits
  split = [f"  {it} nan = x != x;",
           f"  {ft} z = ({ft})(~nan & ({it})c), r = (z + 12582912.0f) - 12582912.0f, f = c - r;",
           f"  {it} n = __builtin_convertvector(r, {it}), h = n >> 1;",
           f"  {ft} p = {_exp2_poly(fma, ft)};",
           f"  return (p * ({ft})((h + 127) << 23)) * ({ft})((n - h + 127) << 23);"]
  if n in _SCALEF:
    # AVX-512's vscalefps is p * 2^r in one correctly rounded step, the two exact powers' result: no int lanes,
    # and a NaN needs no zeroing (no conversion to int); 9 ops fewer (the softmax exp kernel at width 16)
    call, isa = _SCALEF[n]
    split = [f"#if defined(__x86_64__) && defined({isa})",
             f"  {ft} r = (c + 12582912.0f) - 12582912.0f, f = c - r;", f"  {ft} p = {_exp2_poly(fma, ft)};",
             f"  return {call.format(a='p', b='r')};", "#else", *split, "#endif"]
  body = [*masked, *split]
  if n in _REDUCE:
    # AVX512DQ's vreduceps is x - rne(x), exact, and 0 for an infinite x; with vrndscaleps's rne(x) and vscalefps no
    # clamp is needed: p * 2^r overflows to inf, or underflows to 0, as the clamped x's did, and inf gives 2^inf * 1.
    # 2 ops where the clamp, the rounding trick and f took 5 (the softmax exp kernel at width 16, Zen 4: 1.2x)
    rnd, red, red_gcc, isa = _REDUCE[n]
    f = [f"  {ft} f = {red.format(a='x')};"]
    if red_gcc != red: f = ["#if defined(__clang__)", *f, "#else", f"  {ft} f = {red_gcc.format(a='x')};", "#endif"]
    body = [f"#if defined(__x86_64__) && {isa}", f"  {ft} r = {rnd.format(a='x')};", *f,
            f"  {ft} p = {_exp2_poly(fma, ft)};", f"  return {_SCALEF[n][0].format(a='p', b='r')};", "#else",
            *body, "#endif"]
  return "\n".join([f"static inline {ft} {name}({ft} x) {{", *body, "}"])

# x86 lane-wise min(a, b) and max(a, b) of n floats, each b where either is NaN: (min, max, ISA macro); AVX-512's
# with every lane of the write mask set and the current rounding (the softmax exp kernel at width 16: 2 ops, not 7)
_MINMAX = {4: ("__builtin_ia32_minps({a}, {b})", "__builtin_ia32_maxps({a}, {b})", "__SSE__"),
           8: ("__builtin_ia32_minps256({a}, {b})", "__builtin_ia32_maxps256({a}, {b})", "__AVX__"),
           16: ("__builtin_ia32_minps512_mask({a}, {b}, {a}, (uint16_t)-1, 4)",
                "__builtin_ia32_maxps512_mask({a}, {b}, {a}, (uint16_t)-1, 4)", "__AVX512F__")}

# AVX-512 a * 2^floor(b) of n floats, rounded once: (builtin call, ISA macro)
_SCALEF = {4: ("__builtin_ia32_scalefps128_mask({a}, {b}, {a}, (uint8_t)-1)", "__AVX512VL__"),
           8: ("__builtin_ia32_scalefps256_mask({a}, {b}, {a}, (uint8_t)-1)", "__AVX512VL__"),
           16: ("__builtin_ia32_scalefps512_mask({a}, {b}, {a}, (uint16_t)-1, 4)", "__AVX512F__")}

# AVX512DQ x rounded to nearest even, and x minus that, on n floats (imm8 0: no fraction bits, to nearest even):
# (round, reduce, reduce as GCC spells it, ISA condition). Clang's 512-bit reduce builtin takes a rounding argument
_RND = "__builtin_ia32_rndscaleps{v}_mask({{a}}, 0, {{a}}, (uint{m}_t)-1{r})"
_RED = "__builtin_ia32_reduceps{v}_mask({{a}}, 0, {{a}}, (uint{m}_t)-1{r})"
_REDUCE = {4: (_RND.format(v="_128", m=8, r=""), _RED.format(v="128", m=8, r=""), _RED.format(v="128", m=8, r=""),
               "defined(__AVX512DQ__) && defined(__AVX512VL__)"),
           8: (_RND.format(v="_256", m=8, r=""), _RED.format(v="256", m=8, r=""), _RED.format(v="256", m=8, r=""),
               "defined(__AVX512DQ__) && defined(__AVX512VL__)"),
           16: (_RND.format(v="", m=16, r=", 4"), _RED.format(v="512", m=16, r=", 4"), _RED.format(v="512", m=16, r=""),
                "defined(__AVX512DQ__)")}
