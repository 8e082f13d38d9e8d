"""C source of the native renderer's x86 helpers: small static inline functions spelled through the compiler's
builtins (the intrinsics' headers would add ~0.4 s to every compile), each with a portable fallback for other ISAs:
the stride-2 deinterleave, non-temporal, masked and fused multiply-add vector ops. Imports only the standard
library."""
from __future__ import annotations
import functools

# lanes 0, 2, 4, 6 of a and 1, 3, 5, 7 of b: within each 128-bit half a0 a2 b1 b3 | a4 a6 b5 b7, then the middle
# 64-bit pairs swapped
DEINT8 = "\n".join([
  "static inline {vt} ko_deint_float8({vt} a, {vt} b) {{",
  "#if defined(__x86_64__) && defined(__AVX2__)",
  "  typedef double ko_double4 __attribute__((vector_size(32)));",
  "  return ({vt})__builtin_ia32_permdf256((ko_double4)__builtin_ia32_shufps256(a, b, 0xD8), 0xD8);",
  "#else",
  "  return ({vt}){{a[0], a[2], a[4], a[6], b[1], b[3], b[5], b[7]}};",
  "#endif",
  "}}"])

# x86 non-temporal store of n floats: (builtin, ISA macro)
MOVNT = {4: ("__builtin_ia32_movntps", "__SSE__"), 8: ("__builtin_ia32_movntps256", "__AVX__"),
          16: ("__builtin_ia32_movntps512", "__AVX512F__")}

@functools.lru_cache(None)
def stream_helper(name: str, vt: str, n: int) -> str:
  """A vector store that skips the caches where it can: clang's __builtin_nontemporal_store, gcc's movntps builtin
  (either needs the address aligned to the vector: checked, else a plain store); a plain store on other hosts."""
  lines = ["#if defined(__x86_64__) && defined(__SSE__)", "#define ko_stream_fence() __builtin_ia32_sfence()", "#else",
           "#define ko_stream_fence() ((void)0)", "#endif", f"static inline void {name}(float* p, {vt} v) {{"]
  if n in MOVNT:
    fn, isa = MOVNT[n]
    lines += [f"#if defined(__x86_64__) && defined({isa})",
              f"  if (((uintptr_t)p & {4 * n - 1}) == 0) {{",
              "#if defined(__clang__)",
              f"    __builtin_nontemporal_store(v, ({vt}*)p);",
              "#else",
              f"    {fn}(p, v);",
              "#endif",
              "    return;",
              "  }",
              "#endif"]
  return "\n".join(lines + ["  memcpy(p, &v, sizeof(v));", "}"])

# x86 masked store of n floats, the closed lanes never touched: (builtin call on p, the lane mask k and v, ISA macro)
MASKSTORE = {4: ("__builtin_ia32_maskstoreps((float4*)p, k, v)", "__AVX__"),
              8: ("__builtin_ia32_maskstoreps256((float8*)p, k, v)", "__AVX__"),
              16: ("__builtin_ia32_storeups512_mask((float*)p, v, (uint16_t)m)", "__AVX512F__")}

def mstore_helper(name: str, vt: str, n: int) -> str:
  """ko_mstore_<vt>(b, i, v, m): lane l of v to b[i + l] where bit l of m is set, through the ISA's masked store
  where it has one (the lanes' bits as the sign bits of a vector of ints on AVX, m itself on AVX-512), else lane by
  lane. As in the masked load, the address is formed as an integer and the closed lanes are never touched."""
  decl = f"static inline void {name}(float* b, int32_t i, {vt} v, int32_t m) {{"
  loop = f"for (int l = 0; l < {n}; l++) if ((m >> l) & 1) b[i + l] = v[l];"
  if n not in MASKSTORE: return f"{decl} {loop} }}"
  call, isa = MASKSTORE[n]
  addr = "  void* p = (void*)((uintptr_t)b + (intptr_t)i * (intptr_t)sizeof(float));"
  lanes = [] if n == 16 else [f"  typedef int32_t ko_lanes{n} __attribute__((vector_size({4 * n})));",
                              f"  ko_lanes{n} k = ((ko_lanes{n}){{0}} + m) << (ko_lanes{n}){{"
                              f"{', '.join(str(31 - l) for l in range(n))}}};"]
  return "\n".join([decl, f"#if defined(__x86_64__) && defined({isa})", *lanes, addr, f"  {call};", "#else",
                    f"  {loop}", "#endif", "}"])

# x86 masked load of n floats, the closed lanes never touched: (builtin call on p and the lane mask k, ISA macro)
MASKLOAD = {4: ("__builtin_ia32_maskloadps((const float4*)p, k)", "__AVX__"),
             8: ("__builtin_ia32_maskloadps256((const float8*)p, k)", "__AVX__"),
             16: ("__builtin_ia32_loadups512_mask((const float*)p, (float16){0}, (uint16_t)m)", "__AVX512F__")}

def mload_helper(decl: str, fast: str, loop: str, vt: str, n: int) -> str:
  """A partial vector load through the ISA's masked load where it has one (AVX: the lanes' bits of m as the sign
  bits of a vector of ints, all the instruction reads; AVX-512: m itself), else the all-open `fast` path and the
  lane-by-lane `loop`: the border of a padded load then needs no help from the loop vectorizer, which runtime/cpu.py's
  miscompile table may switch off. The address is formed as an integer (it points before the buffer when the first
  lanes are padding; those lanes are never read). AVX takes no all-open branch: its join made gcc 12 spill two of a
  conv tile's eight accumulators in the border loop (the reference's conv 64x56, 1 thread, Zen 3: 1.07-1.16x, with
  the mask's shared row check a select, passes.load_masks.masked_load_mask)."""
  call, isa = MASKLOAD[n]
  addr = "  const void* p = (const void*)((uintptr_t)b + (intptr_t)i * (intptr_t)sizeof(float));"
  if n == 16:
    return "\n".join([f"{decl} {fast}", f"#if defined(__x86_64__) && defined({isa})", addr, f"  return {call};",
                      "#else", f"  {loop}", "#endif", "}"])
  shifts = ", ".join(str(31 - l) for l in range(n))
  return "\n".join([decl, f"#if defined(__x86_64__) && defined({isa})",
                    f"  typedef int32_t ko_lanes{n} __attribute__((vector_size({4 * n})));",
                    f"  ko_lanes{n} k = ((ko_lanes{n}){{0}} + m) << (ko_lanes{n}){{{shifts}}};", addr,
                    f"  return {call};", "#else", f"  {fast} {loop}", "#endif", "}"])

# x86 fused multiply-add of n floats: (builtin, its extra arguments, ISA macro); the builtins need no header
VFMADD = {4: ("__builtin_ia32_vfmaddps", "", "__FMA__"), 8: ("__builtin_ia32_vfmaddps256", "", "__FMA__"),
           16: ("__builtin_ia32_vfmaddps512_mask", ", (uint16_t)-1, 4", "__AVX512F__")}

@functools.lru_cache(None)
def fma_helper(name: str, vt: str, n: int) -> str:
  """Lane-wise fmaf: one vfmadd...ps through the compiler's builtin where the ISA has it (the intrinsics' headers
  would add ~0.4 s to every compile), else a loop over the lanes. The builtin keeps the FMA when the loop vectorizer
  is off (the gcc 12 workaround of runtime/cpu.py's miscompile table)."""
  loop = f"{vt} r; for (int l = 0; l < {n}; l++) r[l] = fmaf(a[l], b[l], c[l]); return r;"
  if n not in VFMADD: return f"static inline {vt} {name}({vt} a, {vt} b, {vt} c) {{ {loop} }}"
  fn, extra, isa = VFMADD[n]
  return "\n".join([f"static inline {vt} {name}({vt} a, {vt} b, {vt} c) {{",
                    f"#if defined(__x86_64__) && defined({isa})", f"  return {fn}(a, b, c{extra});",
                    "#else", f"  {loop}", "#endif", "}"])
