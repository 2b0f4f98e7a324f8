"""The former name of `cuda_mem.torch` (cuda-mem's PyTorch allocator): the same module object."""
import sys

import cuda_mem.torch

sys.modules[__name__] = cuda_mem.torch
