"""tileinfer_attn: attention kernels over a paged KV cache, as torch custom ops.

The ops live in ``torch.ops.tileinfer_attn`` (schemas: csrc/torch_bindings.cpp);
``tileinfer_attn.ops`` wraps them with argument checks and docstrings.
"""
import torch  # noqa: F401  (first: _C links against libtorch / libc10, which torch loads)

from . import _C  # noqa: F401  (registers the ops)
from . import _fake  # noqa: F401  (fake implementations for torch.compile)
from .ops import *  # noqa: F401,F403
from .cache import PagedKVCache  # noqa: F401

__version__ = "0.1.0"
