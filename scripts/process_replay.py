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
import fnmatch
import importlib.util
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

def _use_tree(root: str) -> None:
  """Import kernopt, the catalogue and the workloads from the tree at root (before anything imported them). A tree
  older than kernopt.capture and kernopt.replay (a commit compared with --against) gets this tree's."""
  for p in (os.path.join(root, "benchmarks"), os.path.join(root, "tests"), root):
    if p not in sys.path[:3]: sys.path.insert(0, p)
  import kernopt
  where = os.path.dirname(os.path.dirname(os.path.abspath(kernopt.__file__)))
  if os.path.realpath(where) != os.path.realpath(root):
    raise RuntimeError(f"kernopt was imported from {where}, not from the tree at {root}")
  for name in ("capture", "replay"):
    if importlib.util.find_spec(f"kernopt.{name}") is None:
      spec = importlib.util.spec_from_file_location(f"kernopt.{name}", os.path.join(ROOT, "kernopt", f"{name}.py"))
      assert spec is not None and spec.loader is not None
      module = sys.modules[f"kernopt.{name}"] = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(module)
      setattr(kernopt, name, module)

def profiles() -> dict[str, Callable[[], Any]]:
  """Profile name -> a factory of a fresh renderer (kernopt.capture.profiles)."""
  from kernopt import capture as cap
  return cap.profiles()

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

def capture_one(case: str, ast: Any, profile: str, renderer: Any) -> dict[str, Any]:
  """The entry of ast under renderer (kernopt.replay.capture_one)."""
  from kernopt import replay as rp
  return rp.capture_one(case, ast, profile, renderer)

def dumps(entry: dict[str, Any]) -> str:
  from kernopt import capture as cap
  return cap.dumps(entry)

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
  from kernopt import capture as cap
  return cap.read_capture(folder)

def write_capture(files: dict[str, str], folder: str = REPLAY_DIR) -> tuple[int, int]:
  """Write files under folder and remove the stale ones; (written or changed, removed)."""
  from kernopt import capture as cap
  return cap.write_capture(files, folder)

def differences(old: dict[str, str], new: dict[str, str], old_label: str = "capture",
                new_label: str = "tree") -> list[tuple[str, str]]:
  """(path, unified diff) of every file that differs between two captures, in path order."""
  from kernopt import capture as cap
  return cap.differences(old, new, old_label, new_label)

def source_view(text: str) -> str:
  from kernopt import capture as cap
  return cap.source_view(text)

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
