"""The OpenCL dialect."""
from __future__ import annotations
from kernopt.renderers.cstyle import CStyleLanguage

class OpenCLRenderer(CStyleLanguage):
  device = "OPENCL"
  supports_images = True
