// The whole op API of tileinfer_attn: every schema, in one place.
//
// Conventions:
// - Out-style: ops write into tensors they are given and return nothing; every
//   tensor written is declared mutated with (x!).
// - Token tensors (q, k, v, out): [num_tokens, num_heads, head_dim], last dim
//   contiguous; token and head strides are free (views of a packed qkv work).
// - Pools: [num_pages, num_kv_heads, page_size, head_dim], contiguous.
// - block_tables [num_seqs, max_pages] int32, seq_lens [num_seqs] int32 (positions
//   cached after this step's keys), cu_seqlens_q [num_seqs + 1] int32. Query t of
//   sequence s sits at position seq_lens[s] - n_s + t. All three live on the
//   device and are read by the kernels: a captured CUDA graph stays valid as
//   sequences grow.
// - int8 / fp8 (float8_e4m3fn) cache: k_scale / v_scale [num_pages,
//   num_kv_heads, page_size] fp32, one scale per cached vector, or (fp8) [1]
//   / [], one per pool; k_smooth [num_kv_heads, head_dim] fp32 per-channel
//   key smoothing factors (optional).
// - lse outputs are natural-log log-sum-exp of the scaled scores, fp32; rows
//   that see no position get lse = -inf and out = 0.
// - Per-layer variants of prefill / decode / attention (last, with defaults
//   that turn them off; shapes and constants only, so graph-safe):
//   window_left: a query at position p sees keys [p - window_left, p]
//   (causal; non-causal: from p - window_left on), -1: no window; pages wholly
//   before the window are never read. logits_soft_cap: scores s (after
//   scale) become cap * tanh(s / cap) before masking, 0: off. sinks
//   [num_q_heads] fp32 or None: a per-head logit that joins each row's softmax
//   denominator once (lse includes it; decode: in split 0's partial only, so
//   combine counts it once), never a key. tree_mask [num_tokens] int32 or
//   None (decode and attention; steps of <= 16 queries per sequence, prefill
//   rejects it): bit j of the word of a sequence's step token i says whether it
//   sees step token j (the key at seq_lens[s] - n_s + j); positions before the
//   step are all visible; under causal a bit at j > i is ignored.
//
// Implementations: csrc/cpu/ (CPU), csrc/ops/ (CUDA), csrc/attention.cpp (the
// decode-vs-prefill dispatcher, both devices). Fakes: tileinfer_attn/_fake.py.
#include <Python.h>
#include <torch/library.h>

#include "ops.h"

// An empty Python module, so that `import tileinfer_attn._C` loads this shared
// library and runs the static registrations below (as pytorch/extension-cpp does).
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}

TORCH_LIBRARY(tileinfer_attn, m) {
  m.set_python_module("tileinfer_attn._fake");

  // FlashAttention-2-style attention of a varlen batch over the paged cache.
  // out [num_tokens, num_q_heads, head_dim]; lse [num_tokens, num_q_heads] fp32 or None;
  // sinks [num_q_heads] fp32 or None.
  // max_q_len: host upper bound of any sequence's query count (sizes the grid).
  m.def(
      "prefill(Tensor(a!) out, Tensor(b!)? lse, Tensor q, Tensor k_cache, Tensor v_cache, "
      "Tensor block_tables, Tensor seq_lens, Tensor cu_seqlens_q, int max_q_len, float scale, "
      "bool causal, Tensor? k_scale=None, Tensor? v_scale=None, Tensor? k_smooth=None, "
      "int window_left=-1, float logits_soft_cap=0.0, Tensor? sinks=None, Tensor? tree_mask=None) -> ()");

  // Split-KV decode for steps of 1-16 queries per sequence, GQA-packed.
  // partial_out [num_splits, num_tokens, num_q_heads, head_dim] fp32,
  // partial_lse [num_splits, num_tokens, num_q_heads] fp32; num_splits = partial_out.size(0).
  // The splits divide the pages from the window's first page on; sinks [num_q_heads].
  m.def(
      "decode(Tensor(a!) partial_out, Tensor(b!) partial_lse, Tensor q, Tensor k_cache, "
      "Tensor v_cache, Tensor block_tables, Tensor seq_lens, Tensor cu_seqlens_q, int max_q_len, "
      "float scale, bool causal, Tensor? k_scale=None, Tensor? v_scale=None, "
      "Tensor? k_smooth=None, int window_left=-1, float logits_soft_cap=0.0, Tensor? sinks=None, "
      "Tensor? tree_mask=None) -> ()");

  // Merges partial results (decode splits, or prefill outputs with lse over
  // disjoint page ranges). out [num_tokens, num_q_heads, head_dim] (bf16/fp16/fp32);
  // lse [num_tokens, num_q_heads] fp32 or None; partials as in decode.
  m.def(
      "combine(Tensor(a!) out, Tensor(b!)? lse, Tensor partial_out, Tensor partial_lse) -> ()");

  // Attention for a step: decode (+ combine) for the sequences of 1-16
  // queries, prefill for the others. Same arguments as prefill, plus
  // batch_invariant: each sequence's bits independent of the rest of the step
  // (decode splits from its own length, tiles from shapes of the model only;
  // tileinfer/decode_splits.h).
  m.def(
      "attention(Tensor(a!) out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
      "Tensor seq_lens, Tensor cu_seqlens_q, int max_q_len, float scale, bool causal, "
      "Tensor? k_scale=None, Tensor? v_scale=None, Tensor? k_smooth=None, int window_left=-1, "
      "float logits_soft_cap=0.0, Tensor? sinks=None, Tensor? tree_mask=None, "
      "bool batch_invariant=False) -> ()");

  // The split count attention gives decode on a device of num_sms multiprocessors
  // (<= 0: the CPU path). Shapes only, never context length; the same for every
  // step size, head dim and cache type.
  m.def("decode_num_splits(int num_sms, int num_seqs, int num_kv_heads) -> int", &tileinfer::decode_num_splits_op);

  // The support table (csrc/include/tileinfer/tile_table.h), for Python:
  // supported("head_dims" | "page_sizes") -> the values with kernels;
  // supported_dtypes("float" | "half" | "cache" | "quant") -> dtype names as
  // torch spells them: q / out / an unquantized cache; the 16-bit ones (q over
  // a quantized cache); the cache; the quantized cache types (int8, fp8). No tensor arguments: the same answer on every device, in CPU-only
  // builds and under fake tensors.
  m.def("supported(str what) -> int[]", &tileinfer::supported_op);
  m.def("supported_dtypes(str what) -> str[]", &tileinfer::supported_dtypes_op);

  // Per-head RMSNorm over the last dim, as Qwen3's q_norm / k_norm:
  // out = weight * round(x * rsqrt(mean(x^2) + eps)), computed in fp32.
  // x, out [num_tokens, num_heads, head_dim]; weight [head_dim].
  m.def("rms_norm(Tensor(a!) out, Tensor x, Tensor weight, float eps) -> ()");

  // Rotary embedding, neox rotate-half style, on the first rotary_dim channels
  // (the rest are copied). x, out [num_tokens, num_heads, head_dim];
  // positions [num_tokens] int32/int64; cos_sin_cache [max_position, rotary_dim]
  // fp32, cos in [:rotary_dim/2], sin in [rotary_dim/2:].
  m.def(
      "rope(Tensor(a!) out, Tensor x, Tensor positions, Tensor cos_sin_cache, int rotary_dim) -> ()");

  // Writes this step's keys and values into their pages: token t of sequence s
  // goes to position seq_lens[s] - n_s + t of that sequence. k, v
  // [num_tokens, num_kv_heads, head_dim]. With a quantized cache, quantizes
  // (keys divided by k_smooth first) and writes per-vector k_scale / v_scale
  // (a per-tensor fp8 scale is only read).
  m.def(
      "cache_write(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, "
      "Tensor block_tables, Tensor seq_lens, Tensor cu_seqlens_q, Tensor(c!)? k_scale=None, "
      "Tensor(d!)? v_scale=None, Tensor? k_smooth=None) -> ()");

  // Fused: optional q/k RMSNorm, RoPE at each token's position (from the
  // sequence metadata, or positions [num_tokens] int32/int64 when given: a
  // tree verify step rotates by tree depth while its cache slots stay
  // consecutive), queries written to q_out, keys and values into the cache.
  // Bit-identical to rms_norm + rope + cache_write.
  // q, q_out [num_tokens, num_q_heads, head_dim]; k, v [num_tokens, num_kv_heads, head_dim];
  // q_norm_weight / k_norm_weight [head_dim] or None.
  m.def(
      "attention_inputs(Tensor(a!) q_out, Tensor(b!) k_cache, Tensor(c!) v_cache, Tensor q, "
      "Tensor k, Tensor v, Tensor block_tables, Tensor seq_lens, Tensor cu_seqlens_q, "
      "Tensor cos_sin_cache, int rotary_dim, Tensor? q_norm_weight, Tensor? k_norm_weight, "
      "float eps, Tensor(d!)? k_scale=None, Tensor(e!)? v_scale=None, "
      "Tensor? k_smooth=None, Tensor? positions=None) -> ()");
}
