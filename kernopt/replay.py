"""Process replay: a capture (kernopt.capture's format) rendered again with the code in this process, and the kernels
whose source changed. A file of scripts/process_replay.py's capture re-runs the standard protocol; a RUN_PROCESS_REPLAY
file (`"replay": "opts"`) re-applies its Opts under its knobs. Imports capture, errors, helpers, kernel, ops and opt."""
from __future__ import annotations
import json, os
from typing import Any
from kernopt import capture
from kernopt.errors import KernoptError, VerifyError
from kernopt.helpers import Config, config_override
from kernopt.ops import LazyOp, ast_from_json

def capture_one(case: str, ast: LazyOp, profile: str, renderer: Any) -> dict[str, Any]:
  """The entry of ast under renderer: the standard protocol, rendered; a refusal (any KernoptError) records its
  class and the step that refused."""
  from kernopt.kernel import Kernel
  step, k = "kernel", None
  try:
    k = Kernel(ast, opts=renderer)
    step = "optimize"
    k.required_optimizations()
    if not k.apply_tensor_cores(): k.hand_coded_optimizations()
    step = "render"
    prg = k.to_program()
  except KernoptError as e:
    opts = [] if k is None else [[o.op.name, o.axis, o.amt] for o in k.applied_opts]
    return capture.entry(case, profile, ast, renderer, opts, refused={"error": type(e).__name__, "step": step})
  return capture.entry(case, profile, ast, renderer, [[o.op.name, o.axis, o.amt] for o in k.applied_opts], prg)

def _with_opts(old: dict[str, Any], ast: LazyOp, renderer: Any) -> dict[str, Any]:
  """A RUN_PROCESS_REPLAY entry rendered again: its Opts applied in order to a fresh Kernel."""
  from kernopt.kernel import Kernel
  from kernopt.opt import Opt, OptOps
  extra = {"replay": old["replay"], "knobs": old.get("knobs", {})}
  step, applied = "kernel", []
  try:
    k = Kernel(ast, opts=renderer)
    step = "optimize"
    for op, axis, amt in old.get("opts", []):
      if op not in OptOps.__members__: raise VerifyError(f"the capture names an unknown Opt {op!r}")
      k.apply_opt(Opt(OptOps[op], axis, amt))
      applied.append([op, axis, amt])
    step = "render"
    prg = k.to_program()
  except KernoptError as e:
    return capture.entry(old["case"], old["profile"], ast, renderer, applied,
                         refused={"error": type(e).__name__, "step": step}, **extra)
  return capture.entry(old["case"], old["profile"], ast, renderer, applied, prg, **extra)

def rerender(text: str, where: str = "capture") -> str:
  """One capture file's text as this code renders it. VerifyError for a file that is not a capture entry,
  UnsupportedError for a renderer this code can't rebuild."""
  try:
    old = json.loads(text)
    if not isinstance(old, dict): raise ValueError("not a JSON object")
    ast, caps = ast_from_json(old["ast"]), old["capabilities"]
    case, profile = old["case"], old["profile"]
  except (ValueError, KeyError, TypeError, RecursionError) as e:
    raise VerifyError(f"{where} is not a process-replay capture entry ({type(e).__name__}: {e})") from None
  profiles = capture.profiles()
  renderer = profiles[profile]() if profile in profiles and old.get("replay") != "opts" else None
  if renderer is None or capture.jsonable(renderer.capabilities()) != caps:
    renderer = capture.renderer_from_capabilities(caps)
  knobs = {f: Config.__dataclass_fields__[f].default for f in Config.__dataclass_fields__ if f != "CACHE_DIR"}
  knobs.update({k: v for k, v in (old.get("knobs") or {}).items() if k in capture.CODEGEN_KNOBS})
  with config_override(**{**knobs, "DISABLE_CACHE": 1, "RUN_PROCESS_REPLAY": 0, "DEBUG": 0}):
    new = _with_opts(old, ast, renderer) if old.get("replay") == "opts" else capture_one(case, ast, profile, renderer)
  return capture.dumps(new)

def read(path: str) -> dict[str, str]:
  """{relative path: text} of a capture: one file, or every <profile>/<case>.json under a directory."""
  if os.path.isdir(path): return capture.read_capture(path)
  with open(path, encoding="utf-8") as f: return {os.path.basename(path): f.read()}

def replay(files: dict[str, str]) -> list[tuple[str, str]]:
  """(path, unified diff) of every captured kernel whose file this code writes differently, in path order."""
  return capture.differences(files, {rel: rerender(text, rel) for rel, text in files.items()}, "capture", "now")
