"""The heuristics profiles by name: a renderer's `caps.heuristics` picks the rules Kernel.hand_coded_optimizations
tries before the spec's (kernopt/heuristics.py); no device name is consulted. A profile is a function of the Kernel
that applies its Opts and returns True, or returns False and leaves the choice to the spec's rules. Each profile's own
module registers it when imported (kernopt/__init__.py imports the built-in ones), since they sit below the Kernel
they call: the Kernel never imports them. Imports errors."""
from __future__ import annotations
import importlib
from typing import Any, Callable, Union
from kernopt.errors import UnsupportedError

Profile = Callable[[Any], bool]   # (kernel) -> whether it chose the Opts; False: the spec's rules choose

# "spec" (kernopt.heuristics: the spec's rules, every static profile's and every other profile's fallback),
# "cpu_native" (heuristics_cpu), "opencl_cpu" (heuristics_opencl), "cuda_gpu" (heuristics_cuda)
_PROFILES: dict[str, Union[Profile, str]] = {}

def register_heuristics(name: str, fn: Union[Profile, str]) -> None:
  """Make a renderer whose caps.heuristics is `name` run fn (a profile, or "module:function" naming one) before the
  spec's rules; a later registration of the same name replaces it."""
  if type(name) is not str or not name: raise UnsupportedError(f"a heuristics profile needs a name, got {name!r}")
  if not callable(fn) and not (isinstance(fn, str) and fn.count(":") == 1):
    raise UnsupportedError(f"heuristics profile {name!r} must be a function or 'module:function', got {fn!r}")
  _PROFILES[name] = fn

def heuristics_names() -> list[str]: return sorted(_PROFILES)

def heuristics_profile(name: str) -> Profile:
  """The profile registered as `name`; UnsupportedError naming the registered ones when there is none."""
  if (fn := _PROFILES.get(name)) is None:
    raise UnsupportedError(f"no heuristics profile {name!r} is registered (known: {heuristics_names()}); "
                           f"register_heuristics(name, fn) adds one")
  if isinstance(fn, str):
    module, attr = fn.split(":")
    fn = _PROFILES[name] = getattr(importlib.import_module(module), attr)
  return fn
