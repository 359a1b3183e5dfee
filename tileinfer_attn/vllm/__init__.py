"""tileinfer_attn as a vLLM attention backend (an out-of-tree plugin).

Written against vLLM 0.33.0's v1 attention interface
(``vllm/v1/attention/backend.py``). ``tileinfer_attn`` itself never imports
this package, so the kernels do not depend on vLLM; importing this package
does not import vLLM either: the classes load on first use.

vLLM finds the backend through the ``vllm.general_plugins`` entry point in
pyproject.toml, which calls :func:`register`; the user then selects it with
``--attention-backend CUSTOM``.
"""
from __future__ import annotations

__all__ = [
    "register",
    "TileinferAttentionBackend",
    "TileinferAttentionImpl",
    "TileinferAttentionMetadata",
    "TileinferAttentionMetadataBuilder",
    "BACKEND_CLASS_PATH",
]

BACKEND_CLASS_PATH = "tileinfer_attn.vllm.TileinferAttentionBackend"


def register() -> None:
    """Registers the backend as vLLM's ``CUSTOM`` attention backend.

    The ``vllm.general_plugins`` entry point calls this in every vLLM process
    (``vllm.plugins.load_general_plugins``); calling it again is harmless. It
    records the class path only: the backend module loads when vLLM resolves
    ``AttentionBackendEnum.CUSTOM``.
    """
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CUSTOM, BACKEND_CLASS_PATH)


def __getattr__(name):
    if name in __all__ and name not in ("register", "BACKEND_CLASS_PATH"):
        from . import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
