"""The vLLM 0.33.0 attention backend over tileinfer_attn's ops.

Three classes, as vLLM's v1 attention interface asks
(``vllm/v1/attention/backend.py``):

- :class:`TileinferAttentionBackend` (``AttentionBackend``): capabilities and
  the KV-cache layout;
- :class:`TileinferAttentionMetadataBuilder` (``AttentionMetadataBuilder``):
  vLLM's ``CommonAttentionMetadata`` -> :class:`TileinferAttentionMetadata`,
  once per step for all layers of a KV-cache group;
- :class:`TileinferAttentionImpl` (``AttentionImpl``): per layer; ``forward``
  writes the step's keys and values (``cache_write``) and runs ``attention``.

Metadata mapping (vLLM -> our ops):

- ``query_start_loc`` -> ``cu_seqlens_q`` (int32 ``[num_reqs + 1]``, the same
  prefix sums);
- ``seq_lens`` -> ``seq_lens``: vLLM's ``seq_lens`` counts the positions
  computed *including* this step's tokens, which is ours (positions cached after
  this step's keys); query ``t`` of request ``s`` sits at
  ``seq_lens[s] - n_s + t`` in both;
- ``block_table_tensor`` -> ``block_tables`` with every id doubled (the page
  ids of the pool views below);
- ``max_query_len`` -> ``max_q_len`` (a host bound);
- ``slot_mapping`` is not used: ``cache_write`` puts token ``t`` of request
  ``s`` at position ``p = seq_lens[s] - n_s + t``, page
  ``block_table[s, p // block_size]``, slot ``p % block_size``, which is the
  slot vLLM's ``slot_mapping`` holds for that token
  (``block_table[s, p // block_size] * block_size + p % block_size``). Tokens
  that vLLM maps to slot -1 are the padding past ``query_start_loc[-1]`` (a
  batch padded for a CUDA graph); ``cache_write`` writes no token outside the
  requests' query ranges, so they are not written either. The tests check
  the written cache against a write through ``slot_mapping``.

KV-cache layout. vLLM 0.33.0 describes a layer's cache as a logical
``[num_blocks, H, N, C]`` page grid (``H`` head slots, ``N`` token states,
``C`` content) laid out by a ``KVCacheLayout``; by default ``H`` is the KV
heads and ``C`` holds a token's key and value side by side, which no view
turns into separate pools. :meth:`TileinferAttentionBackend.customize_spec`
publishes ``2 * num_kv_heads`` head slots of ``head_size`` elements each
(``num_head_slots`` / ``state_content_bytes``: the mechanism vLLM's own
backends use to split K and V into head slots), and
:meth:`~TileinferAttentionBackend.supported_kv_cache_layouts` asks for
``LBHNC`` only (layer outermost, then block, head slot, token, content). So
each layer's cache is one dense tensor ``[num_blocks, 2 * num_kv_heads,
block_size, head_size]``: block ``b`` holds the key page
``[num_kv_heads, block_size, head_size]`` then the value page, each exactly
our HND page. Viewed as ``pages = [2 * num_blocks, num_kv_heads, block_size,
head_size]`` (contiguous), page ``2b`` is block ``b``'s keys and page
``2b + 1`` its values; ``k_cache = pages[:-1]`` and ``v_cache = pages[1:]``
are contiguous views (no copy) in which page ``2b`` is block ``b``'s keys,
respectively values. Hence the doubled block table. The page size in bytes is
the same as vLLM's default packing, so vLLM sizes the cache as usual.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import ClassVar, Optional

import torch

import tileinfer_attn  # noqa: F401  (registers torch.ops.tileinfer_attn)

from vllm.platforms.interface import DeviceCapability
from vllm.utils.torch_utils import get_dtype_size
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadata,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheLayout, KVQuantMode

__all__ = [
    "TileinferAttentionBackend",
    "TileinferAttentionImpl",
    "TileinferAttentionMetadata",
    "TileinferAttentionMetadataBuilder",
    "kv_cache_pools",
]

_ops = torch.ops.tileinfer_attn

# The extension's support table (csrc/include/tileinfer/tile_table.h).
_HEAD_SIZES = [int(d) for d in _ops.supported("head_dims")]
_BLOCK_SIZES = [int(p) for p in _ops.supported("page_sizes")]
_DTYPES = [getattr(torch, name) for name in _ops.supported_dtypes("float")]
# vLLM kv_cache_dtype names this backend takes: the model's dtype, or e4m3
# with per-tensor scales (KVQuantMode.FP8_PER_TENSOR).
_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
_KV_QUANT_MODES = (KVQuantMode.NONE, KVQuantMode.FP8_PER_TENSOR)

_NAME = "tileinfer_attn"


def _vllm_batch_invariant() -> bool:
    """vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT=1``), read as vLLM
    reads it: through ``vllm.envs`` where the release declares it, else from
    the environment."""
    import vllm.envs as envs

    flag = getattr(envs, "VLLM_BATCH_INVARIANT", None)
    if flag is None:
        try:
            flag = int(os.environ.get("VLLM_BATCH_INVARIANT", "0")) != 0
        except ValueError:
            flag = False
    return bool(flag)


def _refuse(feature: str, detail: str = "") -> None:
    msg = f"{_NAME} vLLM backend: {feature} is not supported"
    raise NotImplementedError(msg + (f" ({detail})" if detail else ""))


def kv_cache_pools(kv_cache: torch.Tensor, num_kv_heads: int):
    """Our ``k_cache`` / ``v_cache`` pools as views of a layer's vLLM cache.

    ``kv_cache`` is the layer's ``[num_blocks, 2 * num_kv_heads, block_size,
    head_size]`` tensor (the layout :class:`TileinferAttentionBackend` asks
    for). Returns two contiguous ``[2 * num_blocks - 1, num_kv_heads,
    block_size, head_size]`` views of its storage: page ``2b`` of the first is
    block ``b``'s keys, page ``2b`` of the second its values (page ids of the
    doubled block table).
    """
    if kv_cache.dim() != 4 or kv_cache.shape[1] != 2 * num_kv_heads or not kv_cache.is_contiguous():
        raise RuntimeError(
            f"{_NAME} vLLM backend: the layer's KV cache must be one dense [num_blocks, 2 * num_kv_heads "
            f"({2 * num_kv_heads}), block_size, head_size] tensor (the LBHNC layout with K and V as head slots, "
            f"no page padding); got shape {tuple(kv_cache.shape)} strides {kv_cache.stride()}. Do not set "
            f"VLLM_KV_CACHE_LAYOUT to another layout, and do not mix this backend with one whose KV cache "
            f"pages are padded")
    num_blocks, _, block_size, head_size = kv_cache.shape
    pages = kv_cache.view(2 * num_blocks, num_kv_heads, block_size, head_size)
    return pages[:-1], pages[1:]


class TileinferAttentionBackend(AttentionBackend):
    """tileinfer_attn's paged attention as a vLLM attention backend.

    What it claims, and why:

    - dtypes bf16, fp16, fp32 (``supported_dtypes("float")``: every op runs
      all three); kv-cache dtypes ``"auto"`` (the cache holds the model's
      dtype) and ``"fp8"`` / ``"fp8_e4m3"``: our float8_e4m3fn cache with
      per-tensor scales, the layer's ``_k_scale`` / ``_v_scale`` (vLLM's
      ``FP8_PER_TENSOR`` layout: pages of e4m3 elements, no per-token
      scales). Our int8 cache has no vLLM name (vLLM's ``int8_per_token_head``
      is its own format); ``fp8_e5m2`` and other quantized caches are refused.
    - head sizes and block sizes from the extension's support table
      (``supported("head_dims")`` = 64, 80, 96, 128, 256; ``supported("page_sizes")``
      = 16, 32, 64, 128 as kernel block sizes: a larger vLLM block that is a
      multiple of one is split into kernel blocks by vLLM).
    - sliding windows (``sliding_window`` w: a query sees its own position
      and the w - 1 before it, ``window_left = w - 1``), logits soft-capping
      and learned attention sinks (gpt-oss: one logit per query head, in the
      model's dtype, converted to fp32 once per parameter version), as the
      layer passes them.
    - causal decoder self-attention only: no ALiBi, no encoder / encoder-only /
      encoder-decoder (cross) attention, no MLA, no non-causal (bidirectional)
      decoder attention, no KV connectors, no decode / prefill context
      parallelism, no adaptive verification (device-side draft trimming).
      vLLM's selection check reports each of these; the impl and builder
      also refuse the ones they are given with an error naming the feature.
    - batch invariance (``VLLM_BATCH_INVARIANT=1``): the impl then calls
      ``attention`` with ``batch_invariant=True``, so a request's bits do not
      depend on its batch (decode splits from each sequence's own length).
    - compute capability 8.0 and newer: the non-Hopper kernels use bf16
      ``mma.sync`` (sm_80+); the Hopper prefill kernel is chosen at run time
      on 9.0 devices. The extension must be built with code for the device
      (``TORCH_CUDA_ARCH_LIST``; the default build has sm_90a code only, i.e.
      H100 / H200).
    - the kernels write the cache inside ``forward``
      (``forward_includes_kv_cache_update``): ``cache_write`` addresses pages
      through the block table and the step's positions, which vLLM's
      separate cache-update hook (given ``slot_mapping`` only) does not pass.
    """

    supported_dtypes: ClassVar[list[torch.dtype]] = list(_DTYPES)
    supported_kv_cache_dtypes: ClassVar[list[str]] = list(_KV_CACHE_DTYPES)

    forward_includes_kv_cache_update: bool = True
    supports_kv_cache_update_bypass: bool = False
    # Older vLLM releases asked whether forward() writes into a given output
    # buffer; ours always does.
    accept_output_buffer: bool = True

    @staticmethod
    def get_name() -> str:
        # vLLM looks the name up in AttentionBackendEnum: the member we register as.
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type["TileinferAttentionImpl"]:
        return TileinferAttentionImpl

    @staticmethod
    def get_builder_cls() -> type["TileinferAttentionMetadataBuilder"]:
        return TileinferAttentionMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return list(_BLOCK_SIZES)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(_HEAD_SIZES)

    @classmethod
    def customize_spec(cls, attn_spec: AttentionSpec) -> AttentionSpec:
        """K and V as ``2 * num_kv_heads`` head slots of ``head_size`` elements
        (keys first), so that a block is ``[K page][V page]`` in our HND page
        format (module docstring). A attn_spec another component packed already
        (``state_content_bytes`` set) and quantized attention specs (refused by the impl)
        are returned unchanged."""
        if attn_spec.state_content_bytes is not None or attn_spec.kv_quant_mode not in _KV_QUANT_MODES:
            return attn_spec
        if attn_spec.head_size_v != attn_spec.head_size:
            _refuse("different key and value head sizes",
                    f"head_size {attn_spec.head_size}, head_size_v {attn_spec.head_size_v}")
        return replace(
            attn_spec,
            num_head_slots=2 * attn_spec.num_kv_heads,
            state_content_bytes=attn_spec.head_size * get_dtype_size(attn_spec.dtype),
        )

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        # Layer outermost and each block's [H, N, C] dense: a layer's cache is
        # one contiguous [num_blocks, 2 * num_kv_heads, block_size, head_size].
        return (KVCacheLayout.LBHNC,)

    @classmethod
    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
        return capability >= DeviceCapability(8, 0)

    @classmethod
    def supports_kv_connector(cls) -> bool:
        # Not tried with any connector: refuse rather than claim.
        return False

    @classmethod
    def supports_device_cpu_query_lens_mismatch(cls) -> bool:
        # Adaptive verification trims drafts on the device only; how seq_lens
        # and the positions follow has not been checked against our cache
        # write, so that mode is refused.
        return False

    # Stated although they are the base class's defaults: the backend's claims in one place.
    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_non_causal(cls) -> bool:
        return False

    @classmethod
    def supports_batch_invariance(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supports_combination(cls, head_size, dtype, kv_cache_dtype, block_size, use_mla, has_sink, use_sparse,
                             use_mm_prefix, device_capability) -> Optional[str]:
        # The fp8 cache's kernels take bf16 / fp16 queries (as the int8 cache's).
        if kv_cache_dtype in ("fp8", "fp8_e4m3") and dtype not in (torch.bfloat16, torch.float16):
            return f"kv_cache_dtype {kv_cache_dtype!r} needs a bfloat16 or float16 model, got {dtype}"
        return None

    @classmethod
    def is_mla(cls) -> bool:
        return False


@dataclass
class TileinferAttentionMetadata(AttentionMetadata):
    """One step's metadata, shared by the layers of a KV-cache group."""

    num_actual_tokens: int  # tokens of the step, maybe padded (vLLM's num_actual_tokens)
    max_query_len: int  # host bound of every request's query count: max_q_len
    max_seq_len: int
    query_start_loc: torch.Tensor  # int32 [num_reqs + 1]: cu_seqlens_q
    seq_lens: torch.Tensor  # int32 [num_reqs]: positions cached after this step
    block_table: torch.Tensor  # int32 [num_reqs, max_blocks]: vLLM's block ids
    page_table: torch.Tensor  # int32 [num_reqs, max_blocks]: 2 * block ids, the block_tables of our ops
    slot_mapping: torch.Tensor  # vLLM's; not read by the ops (module docstring)


def _int32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int32 else t.to(torch.int32)


class TileinferAttentionMetadataBuilder(AttentionMetadataBuilder[TileinferAttentionMetadata]):
    """Builds :class:`TileinferAttentionMetadata` from vLLM's
    ``CommonAttentionMetadata``.

    CUDA graphs: ``ALWAYS``. The ops read positions, lengths and page ids on
    the device and size their grids from shapes and ``max_q_len`` only, so a
    graph captured for ``n`` requests with the same query length (decodes, or
    speculative-decoding verify steps of ``1 + k`` tokens) replays for any
    lengths. For a mixed batch (``cudagraph_mode=FULL``) vLLM captures a graph
    of ``N`` padded tokens with a fixed number of requests and ``max_query_len
    = N``; ``attention`` launched with ``max_q_len = N`` runs any mix of at
    most ``N`` tokens (docs/CONTRACT.md, mixed steps), so the graph replays
    every step padded to it: requests past the real ones have no query and no
    position, tokens past ``query_start_loc[-1]`` belong to no request. The
    doubled block table lives in a buffer allocated once (the same storage
    every step), so a captured graph reads the current step's.

    ``reorder_batch_threshold`` is None: one ``attention`` call handles any
    mix of decodes, verify steps and prompt chunks in any order, so the batch
    is not reordered. In a step whose longest query has more than 16 tokens,
    the requests of <= 16 tokens run on the decode path and the others on the
    prefill path (docs/CONTRACT.md, mixed steps).
    """

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.ALWAYS
    reorder_batch_threshold: Optional[int] = None
    requires_block_table_width: ClassVar[bool] = True

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device, block_table_width: Optional[int] = None):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        if isinstance(kv_cache_spec, AttentionSpec):
            if kv_cache_spec.kv_quant_mode not in _KV_QUANT_MODES:
                _refuse("a quantized KV cache", f"{kv_cache_spec.kv_quant_mode.name}")
            if kv_cache_spec.page_size_padded is not None:
                _refuse("padded KV-cache pages", f"page_size_padded={kv_cache_spec.page_size_padded}: "
                                                 f"our pools are dense")
        size = 0
        if block_table_width is not None:
            size = vllm_config.scheduler_config.max_num_seqs * block_table_width
        # The doubled block table, written in place every step (CUDA graphs).
        self._page_table = torch.zeros(size, dtype=torch.int32, device=device)

    @classmethod
    def get_cudagraph_support(cls, vllm_config, kv_cache_spec) -> AttentionCGSupport:
        return cls._cudagraph_support

    def _page_table_for(self, num_reqs: int, width: int) -> torch.Tensor:
        n = num_reqs * width
        if n > self._page_table.numel():
            # Larger than sized at construction (or no width given): grow once.
            self._page_table = torch.zeros(n, dtype=torch.int32, device=self._page_table.device)
        return self._page_table[:n].view(num_reqs, width)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> TileinferAttentionMetadata:
        cm = common_attn_metadata
        if isinstance(cm.causal, torch.Tensor) or not cm.causal:
            _refuse("non-causal (bidirectional) attention", "CommonAttentionMetadata.causal is not True")
        if common_prefix_len:
            _refuse("cascade attention over a common prefix", f"common_prefix_len={common_prefix_len}")
        block_table = _int32(cm.block_table_tensor)
        page_table = self._page_table_for(*block_table.shape)
        torch.mul(block_table, 2, out=page_table)
        return TileinferAttentionMetadata(
            num_actual_tokens=cm.num_actual_tokens,
            max_query_len=int(cm.max_query_len),
            max_seq_len=int(cm.max_seq_len),
            query_start_loc=_int32(cm.query_start_loc),
            seq_lens=_int32(cm.seq_lens),
            block_table=block_table,
            page_table=page_table,
            slot_mapping=cm.slot_mapping,
        )


class TileinferAttentionImpl(AttentionImpl[TileinferAttentionMetadata]):
    """One attention layer: ``cache_write`` of the step's keys and values, then
    ``attention`` of its queries, both into the layer's KV cache views."""

    can_return_lse_for_decode: bool = False

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: Optional[int] = None,
        alibi_slopes: Optional[list] = None,
        sliding_window: Optional[int] = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: Optional[float] = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: Optional[str] = None,
        sinks: Optional[torch.Tensor] = None,
        use_alibi_sqrt: Optional[bool] = None,
        **extra_impl_args,
    ) -> None:
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if alibi_slopes is not None or use_alibi_sqrt:
            _refuse("ALiBi (alibi_slopes)")
        if attn_type != AttentionType.DECODER:
            names = {AttentionType.ENCODER: "encoder attention",
                     AttentionType.ENCODER_ONLY: "encoder-only attention",
                     AttentionType.ENCODER_DECODER: "encoder-decoder (cross) attention"}
            _refuse(names.get(attn_type, f"attention type {attn_type!r}"), "decoder self-attention only")
        if kv_cache_dtype not in _KV_CACHE_DTYPES:
            _refuse(f"kv_cache_dtype={kv_cache_dtype!r}",
                    "the KV cache holds the model's dtype ('auto') or float8 e4m3 with per-tensor scales "
                    "('fp8', 'fp8_e4m3'); fp8_e5m2 and other quantized caches are not implemented")
        mla = sorted(k for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                 "v_head_dim", "kv_b_proj") if k in extra_impl_args)
        if mla:
            _refuse("MLA (multi-head latent attention)", f"got {', '.join(mla)}")
        unknown = sorted(k for k, v in extra_impl_args.items() if v is not None)
        if unknown:
            _refuse(f"the attention options {', '.join(unknown)}")
        if head_size not in _HEAD_SIZES:
            _refuse(f"head size {head_size}", f"supported: {_HEAD_SIZES}")
        if num_heads % num_kv_heads:
            raise ValueError(f"{_NAME} vLLM backend: num_heads ({num_heads}) must be a multiple of "
                             f"num_kv_heads ({num_kv_heads})")
        if sinks is not None and tuple(sinks.shape) != (num_heads,):
            raise ValueError(f"{_NAME} vLLM backend: sinks must have one logit per query head "
                             f"([{num_heads}]), got shape {tuple(sinks.shape)}")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        # vLLM's sliding_window w: the query's own position and the w - 1 before it.
        self.sliding_window = sliding_window if sliding_window is not None and sliding_window > 0 else None
        self.window_left = self.sliding_window - 1 if self.sliding_window is not None else -1
        self.logits_soft_cap = float(logits_soft_cap) if logits_soft_cap else 0.0
        self.batch_invariant = _vllm_batch_invariant()
        self.alibi_slopes = None
        self.sinks = sinks  # the layer's parameter (weights load after this): converted in forward (_fp32_sinks)

    def forward(
        self,
        layer,
        query: torch.Tensor,
        key: Optional[torch.Tensor],
        value: Optional[torch.Tensor],
        kv_cache: torch.Tensor,
        attn_metadata: Optional[TileinferAttentionMetadata],
        output: torch.Tensor,
        output_scale: Optional[torch.Tensor] = None,
        output_block_scale: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """``query [num_tokens, num_heads, head_size]``, ``key`` / ``value``
        ``[num_tokens, num_kv_heads, head_size]`` (or None when this layer
        reads another layer's cache), ``kv_cache`` the layer's
        ``[num_blocks, 2 * num_kv_heads, block_size, head_size]`` cache,
        ``output [num_tokens, num_heads, head_size]`` written in place and
        returned. Rows of padding tokens (past ``query_start_loc[-1]``) are not
        meaningful."""
        if output_scale is not None or output_block_scale is not None:
            _refuse("fused output quantization")
        if attn_metadata is None:
            # vLLM's profiling run.
            return output.fill_(0)
        m = attn_metadata
        k_cache, v_cache = kv_cache_pools(kv_cache, self.num_kv_heads)
        k_scale = v_scale = None
        if self.kv_cache_dtype != "auto":
            # e4m3 pages (vLLM may allocate them as bytes) and the layer's
            # per-tensor fp32 scales: writes divide by them and saturate.
            if k_cache.dtype != torch.float8_e4m3fn:
                k_cache, v_cache = k_cache.view(torch.float8_e4m3fn), v_cache.view(torch.float8_e4m3fn)
            k_scale, v_scale = layer._k_scale, layer._v_scale
        if self.kv_sharing_target_layer_name is None and key is not None and value is not None:
            _ops.cache_write(k_cache, v_cache, key, value, m.page_table, m.seq_lens, m.query_start_loc,
                             k_scale, v_scale, None)
        _ops.attention(output, query, k_cache, v_cache, m.page_table, m.seq_lens, m.query_start_loc,
                       m.max_query_len, self.scale, True, k_scale, v_scale, None,
                       self.window_left, self.logits_soft_cap, self._fp32_sinks(query.device), None,
                       self.batch_invariant)
        return output

    def _fp32_sinks(self, device: torch.device) -> Optional[torch.Tensor]:
        """The layer's sinks as the kernels take them (fp32 on the queries'
        device): converted once, and again only when the parameter changes
        (weights load after __init__; a reload bumps its version), so a
        step captured in a CUDA graph reads a buffer made before capture."""
        if self.sinks is None:
            return None
        key = (self.sinks.data_ptr(), self.sinks._version, device)
        if getattr(self, "_sinks_key", None) != key:
            self._sinks_f32 = self.sinks.detach().to(device=device, dtype=torch.float32)
            self._sinks_key = key
        return self._sinks_f32
