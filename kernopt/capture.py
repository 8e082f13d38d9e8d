"""The process-replay capture format: one JSON file per (profile, case) holding the AST (canonical JSON), the renderer's
capabilities, the applied Opts, the launch sizes and the source one line per line, so a change reads as a diff. The
pinned profiles of scripts/process_replay.py, the renderer a capabilities record describes, RUN_PROCESS_REPLAY's
captures, and the comparison of two captures. Imports helpers, errors, ops and renderers."""
from __future__ import annotations
import dataclasses, difflib, hashlib, importlib, inspect, json, os
from typing import Any, Callable, Optional
from kernopt.errors import UnsupportedError
from kernopt.helpers import Config, cache_subdir, getconfig
from kernopt.ops import LazyOp, ast_digest, ast_to_json

SM_COUNT_H200 = 132   # the multiprocessors of the GPU heuristics_cuda was measured on
# the limits PoCL's CPU device reported on the reference host (the OPENCL device passes the real device's)
POCL_LIMITS = {"local_max": (4096, 4096, 4096), "max_local_size": 4096, "shared_max": 524288}
# knobs a RUN_PROCESS_REPLAY capture records: those that can change what is rendered
CODEGEN_KNOBS = ("USE_TC", "TC_OPT", "MV", "MV_BLOCKSIZE", "MV_THREADS_PER_ROW", "MV_ROWS_PER_THREAD", "NOLOCALS",
                 "CPU_MARCH", "CPU_THREADS")
_RENDERER_MODULES = ("cstyle", "native", "opencl", "cuda", "metal", "amd")

# ***** profiles: each a renderer with every host-derived capability pinned *****

def _pin(r: Any, **attrs: Any) -> Any:
  """r with attrs pinned: fields of its capabilities record (a tree from before the record: its attributes)."""
  if hasattr(r, "caps"): r.caps = dataclasses.replace(r.caps, **attrs)
  else:
    for k, v in attrs.items(): object.__setattr__(r, k, v)
  return r

def _native(width: int, level: str) -> Callable[[], Any]:
  """The native CPU profile as an x86-64 `level` host with `width` fp32 lanes, 2 cores and a 512 KiB L2 would build
  it. march is "native" only so the constructor never refuses on this host; its ISA facts, load pinning and blocking
  are then fixed. (A commit compared with --against that predates ISA_LEVELS or l2_bytes gets the same profile
  without them.)"""
  def make() -> Any:
    from kernopt.renderers import native
    fma = level != "x86-64-v2"
    kw: dict[str, Any] = {"vector_width": width, "threads": 2, "parallel": "pthread", "fused_accumulate": fma,
                          "march": "native", "l2_bytes": 512 << 10}
    if (levels := getattr(native, "ISA_LEVELS", None)) is not None: kw["isa"] = levels[level]
    accepted = inspect.signature(native.NativeCRenderer).parameters
    r = native.NativeCRenderer(**{k: v for k, v in kw.items() if k in accepted})
    return _pin(r, pin_loads="x")
  return make

def _static(module: str, cls: str, **kw: Any) -> Callable[[], Any]:
  def make() -> Any: return getattr(importlib.import_module(module), cls)(**kw)
  return make

def profiles() -> dict[str, Callable[[], Any]]:
  """Profile name -> a factory of a fresh renderer. Only what a device derives from its host is pinned; the
  dialects' own defaults are left alone, so a change to one of them shows in the capture."""
  return {
    "cpu_native_w4": _native(4, "x86-64-v2"),
    "cpu_native_w8": _native(8, "x86-64-v3"),
    "cpu_native_w16": _native(16, "x86-64-v4"),
    "cpu_static": _static("kernopt.renderers.cstyle", "CRenderer"),
    "opencl_cpu": _static("kernopt.renderers.opencl", "OpenCLRenderer", vector_width=8, clang=True,
                          stream_stores=True, has_fp16=False, supports_images=True, **POCL_LIMITS),
    "opencl": _static("kernopt.renderers.opencl", "OpenCLRenderer"),
    "cuda": _static("kernopt.renderers.cuda", "CUDARenderer"),
    "cuda_h200": _static("kernopt.renderers.cuda", "CUDARenderer", arch="sm_90", heuristics="cuda_gpu",
                         sm_count=SM_COUNT_H200),
    "metal": _static("kernopt.renderers.metal", "MetalRenderer"),
    "amd": _static("kernopt.renderers.amd", "AMDRenderer"),
  }

# ***** the renderer a capabilities record describes *****

def _tuples(v: Any) -> Any: return tuple(_tuples(x) for x in v) if isinstance(v, list) else v

def renderer_from_capabilities(caps: dict[str, Any]) -> Any:
  """A renderer whose capabilities() is exactly caps (as a capture stores it): the dialect's class built with the
  constructor arguments caps names (a native profile's ISA is not probed on this host), every other recorded field of
  its capabilities record pinned. UnsupportedError when no dialect class can carry caps."""
  from kernopt.errors import KernoptError
  from kernopt.renderers import Capabilities, Renderer
  name = caps.get("dialect") if isinstance(caps, dict) else None
  cls = None
  for m in _RENDERER_MODULES:
    c = getattr(importlib.import_module(f"kernopt.renderers.{m}"), str(name), None)
    if isinstance(c, type) and issubclass(c, Renderer): cls = c
  if cls is None: raise UnsupportedError(f"no renderer class {name!r} to rebuild a capture's renderer from")
  params = inspect.signature(cls).parameters
  kw = {k: _tuples(caps[k]) for k in params if k in caps and k != "march"}
  try: r = cls(**kw)
  except (KernoptError, TypeError, ValueError) as e:
    raise UnsupportedError(f"cannot rebuild a {name} renderer from its capabilities: {e}") from None
  known = {f.name for f in dataclasses.fields(Capabilities)} - {"tensor_cores"}
  pinned = {k: _tuples(v) for k, v in caps.items() if k in known and jsonable(getattr(r.caps, k)) != v}
  r.caps = dataclasses.replace(r.caps, **pinned)
  if (got := jsonable(r.capabilities())) != caps:
    bad = sorted(k for k in set(got) | set(caps) if got.get(k) != caps.get(k))
    raise UnsupportedError(f"a {name} renderer can't carry the captured capabilities {bad}")
  return r

# ***** entries and files *****

def jsonable(x: Any) -> Any:
  """x as JSON data: dicts by str key, sequences as lists, sets sorted, anything else by repr."""
  if isinstance(x, dict): return {str(k): jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)): return [jsonable(v) for v in x]
  if isinstance(x, (frozenset, set)): return sorted(jsonable(v) for v in x)
  if x is None or isinstance(x, (bool, int, float, str)): return x
  return repr(x)

def size(dims: Optional[tuple]) -> Optional[list]:
  return None if dims is None else [d if isinstance(d, int) else d.render() for d in dims]

def entry(case: str, profile: str, ast: LazyOp, renderer: Any, opts: list, program: Any = None,
          refused: Optional[dict[str, str]] = None, **extra: Any) -> dict[str, Any]:
  """One capture entry: the rendered program's, or a refusal's ({"error": class name, "step": where})."""
  e: dict[str, Any] = {"case": case, "profile": profile, "ast_digest": ast_digest(ast), "ast": ast_to_json(ast),
                       "capabilities": jsonable(renderer.capabilities()), **extra, "opts": opts}
  if refused is not None: return {**e, "refused": refused}
  return {**e, "name": program.name, "global_size": size(program.global_size),
          "local_size": size(program.local_size), "src": program.src.split("\n")}

def dumps(entry: dict[str, Any]) -> str:
  """entry as JSON text: one key per line, values compact, and the source one line per line."""
  def val(k: str, v: Any) -> str:
    if k != "src": return json.dumps(v, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return "[\n" + ",\n".join(f"  {json.dumps(line)}" for line in v) + "\n ]"
  return "{\n" + ",\n".join(f" {json.dumps(k)}: {val(k, v)}" for k, v in entry.items()) + "\n}\n"

def read_capture(folder: str) -> dict[str, str]:
  """{profile/case.json: file text} of the capture stored under folder."""
  out: dict[str, str] = {}
  if not os.path.isdir(folder): return out
  for profile in sorted(os.listdir(folder)):
    sub = os.path.join(folder, profile)
    if not os.path.isdir(sub): continue
    for name in sorted(os.listdir(sub)):
      if name.endswith(".json"):
        with open(os.path.join(sub, name), encoding="utf-8") as f: out[f"{profile}/{name}"] = f.read()
  return out

def write_capture(files: dict[str, str], folder: str) -> tuple[int, int]:
  """Write files under folder and remove the stale ones; (written or changed, removed)."""
  os.makedirs(folder, exist_ok=True)
  old = read_capture(folder)
  for rel in sorted(set(old) - set(files)): os.remove(os.path.join(folder, rel))
  changed = 0
  for rel, text in files.items():
    if old.get(rel) == text: continue
    os.makedirs(os.path.dirname(os.path.join(folder, rel)), exist_ok=True)
    with open(os.path.join(folder, rel), "w", encoding="utf-8", newline="\n") as f: f.write(text)
    changed += 1
  for profile in os.listdir(folder):
    if os.path.isdir(p := os.path.join(folder, profile)) and not os.listdir(p): os.rmdir(p)
  return changed, len(set(old) - set(files))

def differences(old: dict[str, str], new: dict[str, str], old_label: str = "capture",
                new_label: str = "tree") -> list[tuple[str, str]]:
  """(path, unified diff) of every file that differs between two captures, in path order."""
  ret = []
  for rel in sorted(set(old) | set(new)):
    a, b = old.get(rel), new.get(rel)
    if a == b: continue
    diff = difflib.unified_diff((a or "").splitlines(keepends=True), (b or "").splitlines(keepends=True),
                                f"{old_label}/{rel}" if a is not None else "/dev/null",
                                f"{new_label}/{rel}" if b is not None else "/dev/null")
    ret.append((rel, "".join(diff)))
  return ret

def source_view(text: str) -> str:
  """What --against compares of a capture file: its Opts, launch sizes and source (or refusal), not the AST or the
  capabilities record, whose encodings may change while the code they produce stays the same."""
  e = json.loads(text)
  head = [f"// opts: {json.dumps(e.get('opts'))}"]
  if "refused" in e: return "\n".join([*head, f"// refused: {json.dumps(e['refused'], sort_keys=True)}", ""])
  head.append(f"// global_size: {json.dumps(e.get('global_size'))} local_size: {json.dumps(e.get('local_size'))}")
  return "\n".join([*head, *e.get("src", [])])

# ***** RUN_PROCESS_REPLAY *****

def capture_dir() -> Optional[str]:
  """Where RUN_PROCESS_REPLAY writes: cache_dir/process_replay, private (None, after one warning, when it is not)."""
  return cache_subdir("process_replay")

def record(ast: LazyOp, renderer: Any, opts: list, program: Any) -> Optional[str]:
  """RUN_PROCESS_REPLAY: program (rendered from ast with opts by renderer) as a capture file under capture_dir():
  `<dialect>-<capabilities digest>/<AST digest>-<opts digest>.json`, with the codegen knobs in force and `"replay":
  "opts"` (re-render by applying these Opts; the script's files re-run the standard protocol). The path written."""
  if (root := capture_dir()) is None: return None
  cfg = getconfig()
  caps = jsonable(renderer.capabilities())
  profile = f"{caps['dialect']}-{hashlib.sha256(json.dumps(caps, sort_keys=True).encode()).hexdigest()[:12]}"
  knobs = {k: getattr(cfg, k) for k in CODEGEN_KNOBS if k in Config.__dataclass_fields__}
  e = entry(f"run-{program.name}", profile, ast, renderer, opts, program, replay="opts", knobs=knobs)
  name = f"{e['ast_digest'][:16]}-{hashlib.sha256(json.dumps(opts).encode()).hexdigest()[:8]}.json"
  os.makedirs(folder := os.path.join(root, profile), mode=0o700, exist_ok=True)
  path = os.path.join(folder, name)
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w", encoding="utf-8", newline="\n") as f: f.write(dumps(e))
  os.replace(tmp, path)
  return path
