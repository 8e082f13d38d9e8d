"""The C-style renderer base and the C dialect (device "CPU")."""
from __future__ import annotations
from kernopt.renderers import Renderer

class CStyleLanguage(Renderer):
  """Base of the C-family dialects."""

class CRenderer(CStyleLanguage):
  device = "CPU"
  has_local = False
  has_shared = True   # declared, but without local threads nothing uses it
  supports_float4 = False
  global_max = None
  local_max = (0x8FFFFFFF,) * 3
  shared_max = 32768
