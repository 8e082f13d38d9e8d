"""`check(ast)`: every reason `Kernel(ast)` would refuse an AST, found before a Kernel is built (docs/fusion.md).
Each KERNEL source is verified on its own, so one bad STORE doesn't hide another's problem; then what holds the
STOREs together (distinct buffers, one output shape), then the Kernel's own structural rules. With a renderer, also
what that dialect can't hold (images). Imports dtype, errors, loop_nest, ops and renderers."""
from __future__ import annotations
from typing import Any, Optional
from kernopt import ops
from kernopt.errors import KernoptError
from kernopt.loop_nest import kernel_trackers
from kernopt.ops import BufferOps, ConstBuffer, LazyOp, MemBuffer, MetaOps
from kernopt.dtype import ImageDType
from kernopt.renderers import Renderer

def _message(e: Exception) -> str: return str(e) if isinstance(e, KernoptError) else f"{type(e).__name__}: {e}"

def _root(ast: tuple[Any, ...]) -> tuple[Optional[LazyOp], Optional[str]]:
  """The KERNEL that Kernel(*ast) works on, or why there is none (the same words as Kernel's)."""
  if not ast: return None, "Kernel needs a KERNEL op or one or more STOREs"
  if any(not isinstance(x, LazyOp) for x in ast):
    return None, f"Kernel takes LazyOps, got {[type(x).__name__ for x in ast]}"
  if len(ast) == 1 and ast[0].op is MetaOps.KERNEL: return ast[0], None
  if all(x.op is BufferOps.STORE for x in ast):
    try: return LazyOp(MetaOps.KERNEL, tuple(ast)), None
    except KernoptError as e: return None, _message(e)
  return None, f"Kernel takes one KERNEL op or only STOREs, got {[x.op for x in ast]}"

def _verify(ast: LazyOp) -> Optional[str]:
  try: ops.verify_lazyop(ast)
  except AssertionError as e: return f"invalid AST: {e}"   # as Kernel() words it
  except (KernoptError, RecursionError) as e: return _message(e)
  return None

def _per_store(root: LazyOp) -> list[str]:
  """Each STORE verified as a kernel of its own, then the rules between STOREs, each problem once."""
  found: list[str] = []
  stores = root.src if isinstance(root.src, tuple) else ()
  for s in stores:
    if not isinstance(s, LazyOp) or s.op is not BufferOps.STORE: continue
    try: single = LazyOp(MetaOps.KERNEL, (s,), root.arg)
    except KernoptError as e:
      found.append(_message(e))
      continue
    if (why := _verify(single)) is not None: found.append(why)
  good = [s for s in stores if isinstance(s, LazyOp) and isinstance(s.arg, MemBuffer)]
  seen: set[int] = set()
  for s in good:
    if s.arg.idx in seen: found.append(f"two STOREs write buffer {s.arg.idx}")
    seen.add(s.arg.idx)
  return found

def _dialect(root: LazyOp, opts: Renderer) -> list[str]:
  bufs = [x.arg for x in root.lazyops if x.op in BufferOps and isinstance(x.arg, (MemBuffer, ConstBuffer))]
  if any(isinstance(b.dtype, ImageDType) for b in bufs) and not opts.caps.supports_images:
    return [f"{opts.caps.device} has no images"]
  return []

def check(*ast: LazyOp, opts: Optional[Renderer] = None) -> list[str]:
  """Every reason Kernel(*ast) would refuse `ast` (and, given a renderer `opts`, why that dialect can't run it); an
  empty list when it would be accepted. The list holds the message of what Kernel() raises, and others where the
  checks can go on past the first problem (each STORE is verified on its own). Builds no Kernel and never raises."""
  root, why = _root(ast)
  if root is None: return [why or "no kernel"]
  found: list[str] = []
  if (whole := _verify(root)) is not None:
    found = _per_store(root) if isinstance(root.src, tuple) and len(root.src) > 1 else []
    found.append(whole)
  else:
    try: kernel_trackers(root)
    except (KernoptError, AssertionError) as e: found.append(_message(e))
  if not found and opts is not None:
    if not isinstance(opts, Renderer):
      found.append(f"opts must be a Renderer (a device's .renderer), got {type(opts).__name__} {opts!r}")
    else: found += _dialect(root, opts)
  return list(dict.fromkeys(found))
