"""Process replay: the guard that keeps every rendered kernel byte-identical across a refactor. For each case of
tests/catalogue.py (both scales) and benchmarks/workloads.py, under each pinned renderer profile, the standard
protocol's AST (canonical JSON), applied Opts, launch sizes, source and renderer capabilities go to one file,
tests/replay/<profile>/<case>.json, whose source is one JSON string per line so a change reads as a diff.

  python scripts/process_replay.py                 compare the tree with the capture: a unified diff per changed file
  python scripts/process_replay.py --update        rewrite the capture (stale files removed)
  python scripts/process_replay.py --against REV   compare this tree's capture with git commit REV's

Profiles pin every capability a device would read from its host, so the capture is the same on every machine.
Exit status 1 when anything differs."""
from __future__ import annotations
import argparse
import contextlib
import difflib
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import fields
from typing import Any, Callable, Iterator, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPLAY_DIR = os.path.join(ROOT, "tests", "replay")
SCALES = ("small", "large")
SM_COUNT_H200 = 132   # the multiprocessors of the GPU heuristics_cuda was measured on
# the limits PoCL's CPU device reported on the reference host (the OPENCL device passes the real device's)
POCL_LIMITS = {"local_max": (4096, 4096, 4096), "max_local_size": 4096, "shared_max": 524288}

def _use_tree(root: str) -> None:
  """Import kernopt, the catalogue and the workloads from the tree at root (before anything imported them)."""
  for p in (os.path.join(root, "benchmarks"), os.path.join(root, "tests"), root):
    if p not in sys.path[:3]: sys.path.insert(0, p)
  import kernopt
  where = os.path.dirname(os.path.dirname(os.path.abspath(kernopt.__file__)))
  if os.path.realpath(where) != os.path.realpath(root):
    raise RuntimeError(f"kernopt was imported from {where}, not from the tree at {root}")

# ***** profiles: each a renderer with every host-derived capability pinned *****

def _pin(r: Any, **attrs: Any) -> Any:
  for k, v in attrs.items(): object.__setattr__(r, k, v)
  return r

def _native(width: int, level: str) -> Callable[[], Any]:
  """The native CPU profile as an x86-64 `level` host with `width` fp32 lanes and 2 cores would build it. march is
  "native" only so the constructor never refuses on this host; its ISA facts and load pinning are then fixed. (A
  commit compared with --against that predates ISA_LEVELS gets the same profile without them.)"""
  def make() -> Any:
    import inspect
    from kernopt.renderers import native
    fma = level != "x86-64-v2"
    kw = {"vector_width": width, "threads": 2, "parallel": "pthread", "fused_accumulate": fma, "march": "native"}
    accepted = inspect.signature(native.NativeCRenderer).parameters
    r = native.NativeCRenderer(**{k: v for k, v in kw.items() if k in accepted})
    if (levels := getattr(native, "ISA_LEVELS", None)) is not None: _pin(r, isa=levels[level])
    return _pin(r, pin_loads="x")
  return make

def _static(module: str, cls: str, **kw: Any) -> Callable[[], Any]:
  def make() -> Any:
    import importlib
    return getattr(importlib.import_module(module), cls)(**kw)
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

# ***** cases *****

def cases() -> list[tuple[str, Callable[[], Any]]]:
  """(case id, AST factory) for the catalogue at each scale it has, then the benchmark workloads."""
  import catalogue
  import workloads
  ret: list[tuple[str, Callable[[], Any]]] = []
  for scale in SCALES:
    try: cs = catalogue.catalogue(scale)
    except ValueError: continue
    ret += [(f"{scale}-{c.name}", (lambda c=c: c.ast)) for c in cs]
  ret += [(f"bench-{name}", w.build) for name, w in sorted(workloads.workloads().items())]
  return ret

# ***** capture *****

@contextlib.contextmanager
def pinned_config() -> Iterator[None]:
  """Every knob at its default (whatever the environment says), the on-disk cache off."""
  from kernopt.helpers import Config, config_override
  knobs = {f.name: f.default for f in fields(Config) if f.name != "CACHE_DIR"}
  with config_override(**{**knobs, "DISABLE_CACHE": 1}): yield

def _size(dims: Optional[tuple]) -> Optional[list]:
  return None if dims is None else [d if isinstance(d, int) else d.render() for d in dims]

def _jsonable(x: Any) -> Any:
  if isinstance(x, dict): return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)): return [_jsonable(v) for v in x]
  if isinstance(x, (frozenset, set)): return sorted(_jsonable(v) for v in x)
  if x is None or isinstance(x, (bool, int, float, str)): return x
  return repr(x)

def capture_one(case: str, ast: Any, profile: str, renderer: Any) -> dict[str, Any]:
  """The entry of ast under renderer: the standard protocol, rendered; a refusal (any KernoptError) records its
  class and the step that refused."""
  from kernopt import ops
  from kernopt.errors import KernoptError
  from kernopt.kernel import Kernel
  entry: dict[str, Any] = {"case": case, "profile": profile, "ast_digest": ops.ast_digest(ast),
                           "ast": ops.ast_to_json(ast), "capabilities": _jsonable(renderer.capabilities())}
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
    return {**entry, "opts": opts, "refused": {"error": type(e).__name__, "step": step}}
  return {**entry, "opts": [[o.op.name, o.axis, o.amt] for o in k.applied_opts], "name": prg.name,
          "global_size": _size(prg.global_size), "local_size": _size(prg.local_size), "src": prg.src.split("\n")}

def dumps(entry: dict[str, Any]) -> str:
  """entry as JSON text: one key per line, values compact, and the source one line per line."""
  def val(k: str, v: Any) -> str:
    if k != "src": return json.dumps(v, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return "[\n" + ",\n".join(f"  {json.dumps(line)}" for line in v) + "\n ]"
  return "{\n" + ",\n".join(f" {json.dumps(k)}: {val(k, v)}" for k, v in entry.items()) + "\n}\n"

def capture(only: Optional[Callable[[str, str], bool]] = None) -> dict[str, str]:
  """{relative path: file text} of the whole capture (only: a filter on (profile, case))."""
  out: dict[str, str] = {}
  with pinned_config():
    todo = cases()
    for profile, make in profiles().items():
      for case, build in todo:
        if only is not None and not only(profile, case): continue
        try: renderer = make()
        except Exception as e:   # a commit compared with --against may not have this profile's options
          print(f"process_replay: no profile {profile} here ({type(e).__name__}: {e})", file=sys.stderr)
          break
        out[f"{profile}/{case}.json"] = dumps(capture_one(case, build(), profile, renderer))
  return out

def read_capture(folder: str = REPLAY_DIR) -> dict[str, str]:
  """{relative path: file text} of the capture stored under folder."""
  out: dict[str, str] = {}
  if not os.path.isdir(folder): return out
  for profile in sorted(os.listdir(folder)):
    sub = os.path.join(folder, profile)
    if not os.path.isdir(sub): continue
    for name in sorted(os.listdir(sub)):
      if name.endswith(".json"):
        with open(os.path.join(sub, name), encoding="utf-8") as f: out[f"{profile}/{name}"] = f.read()
  return out

def write_capture(files: dict[str, str], folder: str = REPLAY_DIR) -> tuple[int, int]:
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

# ***** comparing *****

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

def _report(diffs: list[tuple[str, str]], total: int, max_lines: int) -> int:
  shown = 0
  for rel, diff in diffs:
    lines = diff.splitlines(keepends=True)
    if max_lines and shown >= max_lines:
      print(f"--- {rel}: {len(lines)} diff lines (not shown)")
      continue
    sys.stdout.write("".join(lines[:max_lines - shown] if max_lines else lines))
    shown += len(lines)
  print(f"process_replay: {len(diffs)} of {total} files differ" if diffs else f"process_replay: {total} files agree")
  return 1 if diffs else 0

def capture_at(rev: str, only: Optional[list[str]] = None) -> dict[str, str]:
  """The capture of git commit rev: this script run on a temporary worktree of it (kernopt, catalogue, workloads all
  from rev)."""
  tmp = tempfile.mkdtemp(prefix="kernopt-replay-")
  tree, out = os.path.join(tmp, "tree"), os.path.join(tmp, "out")
  try:
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "--quiet", tree, rev], check=True)
    try:
      globs = [a for g in only or () for a in ("--only", g)]
      subprocess.run([sys.executable, os.path.abspath(__file__), "--root", tree, "--out", out, *globs], check=True,
                     stdout=subprocess.DEVNULL)
      return read_capture(out)
    finally: subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", tree], check=False)
  finally: shutil.rmtree(tmp, ignore_errors=True)

def main(argv: Optional[list[str]] = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--update", action="store_true", help="rewrite tests/replay/ from this tree")
  ap.add_argument("--against", metavar="REV", help="compare this tree's capture with the capture of commit REV")
  ap.add_argument("--full", action="store_true", help="with --against: compare whole files, not just the sources")
  ap.add_argument("--out", metavar="DIR", help="write the capture under DIR instead of comparing")
  ap.add_argument("--only", metavar="GLOB", action="append",
                  help="capture only the files whose profile/case matches GLOB (repeatable; e.g. 'cuda*/small-*')")
  ap.add_argument("--root", metavar="TREE", default=ROOT, help="capture the kernopt tree at TREE (default: this one)")
  ap.add_argument("--max-lines", type=int, default=2000, help="diff lines printed in all (0: every line)")
  args = ap.parse_args(argv)
  if args.update and args.only: ap.error("--update rewrites the whole capture; it takes no --only")
  _use_tree(os.path.abspath(args.root))
  only = None if not args.only else lambda p, c: any(fnmatch.fnmatchcase(f"{p}/{c}", g) for g in args.only)
  if args.against is not None:
    old, new = capture_at(args.against, args.only), capture(only)
    if not args.full:
      old, new = ({rel: source_view(t) for rel, t in c.items()} for c in (old, new))
    return _report(differences(old, new, args.against, "tree"), len(set(old) | set(new)), args.max_lines)
  files = capture(only)
  if args.out is not None or args.update:
    changed, removed = write_capture(files, args.out or REPLAY_DIR)
    print(f"process_replay: {len(files)} files, {changed} written, {removed} removed")
    return 0
  stored = {rel: text for rel, text in read_capture().items() if only is None or only(*rel[:-5].split("/", 1))}
  return _report(differences(stored, files), len(set(stored) | set(files)), args.max_lines)

if __name__ == "__main__": sys.exit(main())
