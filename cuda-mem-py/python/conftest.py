"""pytest setup: the tests' helpers (tests/) and, in the bundle, the built `cuda_mem` package sit
beside this file; in a source checkout the installed wheel's package is tested."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (HERE, os.path.join(HERE, "tests")):
    if path not in sys.path:
        sys.path.insert(0, path)
# JAX takes most of the GPU's memory at first use unless told not to; the tests share the GPU
# with PyTorch and CuPy in one process.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
