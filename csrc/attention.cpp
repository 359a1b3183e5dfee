// The attention op: picks decode + combine, or for a step with longer
// sequences decode for its short sequences and prefill for the others, from
// shapes alone, so a captured CUDA graph takes the same path on every step, and
// runs them under its own name (errors raised inside name `attention`). The same code serves CPU
// and CUDA. Also the ops that answer questions about the build: the split rule
// (decode_num_splits) and the support table (supported, supported_dtypes).
#include <iterator>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#ifdef TILEINFER_WITH_CUDA
#include "device_attribute.h"
#endif

#include "checks.h"
#include "ops.h"
#include "tileinfer/decode_splits.h"
#include "tileinfer/tile_table.h"

namespace tileinfer {

// Decode packs group_size * max_q_len query rows of one KV head into a tile
// (any group: 7 heads of one query fill 7 of a 16-row tile, 32 heads take the
// larger tile); beyond 16 queries per sequence the prefill kernel is the
// better (and the supported) path.
bool use_decode_path(int64_t max_q_len) { return max_q_len >= 1 && max_q_len <= kMaxDecodeQueries; }

int64_t sm_count(const at::Device& device) {
#ifdef TILEINFER_WITH_CUDA
  if (device.is_cuda()) return cached_device_attribute<cudaDevAttrMultiProcessorCount>(device.index());
#endif
  return 0;
}

int64_t decode_num_splits(const at::Device& device, int64_t num_seqs, int64_t num_kv_heads) {
  return decode_num_splits_for(sm_count(device), num_seqs, num_kv_heads);
}

int64_t decode_num_splits_op(int64_t num_sms, int64_t num_seqs, int64_t num_kv_heads) {
  return decode_num_splits_for(num_sms, num_seqs, num_kv_heads);
}

std::vector<int64_t> supported_op(c10::string_view what) {
  if (what == "head_dims") return {std::begin(kHeadDims), std::end(kHeadDims)};
  if (what == "page_sizes") return {std::begin(kPageSizes), std::end(kPageSizes)};
  TILEINFER_CHECK(false, "supported: unknown list \"", std::string(what), "\" (expected head_dims or page_sizes)");
  return {};
}

std::vector<std::string> supported_dtypes_op(c10::string_view what) {
  std::vector<std::string> names;
  auto add = [&](const auto& list) {
    for (c10::ScalarType t : list) names.emplace_back(dtype_name(t));
  };
  if (what == "float") {
    add(kFloatDtypes);
  } else if (what == "half") {
    add(kHalfDtypes);
  } else if (what == "cache") {
    add(kCacheDtypes);
  } else if (what == "quant") {
    add(kQuantDtypes);
  } else {
    TILEINFER_CHECK(false, "supported_dtypes: unknown list \"", std::string(what),
                    "\" (expected float, half, cache or quant)");
  }
  return names;
}

void attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
               const at::Tensor& block_tables, const at::Tensor& seq_lens, const at::Tensor& cu_seqlens_q,
               int64_t max_q_len, double scale, bool causal, const std::optional<at::Tensor>& k_scale,
               const std::optional<at::Tensor>& v_scale, const std::optional<at::Tensor>& k_smooth,
               int64_t window_left, double logits_soft_cap, const std::optional<at::Tensor>& sinks,
               const std::optional<at::Tensor>& tree_mask) {
  const char* op = "attention";
  const PagedShape s = check_paged_attention(op, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
                                             max_q_len, k_scale, v_scale, k_smooth);
  check_variants(op, window_left, logits_soft_cap, sinks, q.size(1), q.device());
  check_tree_mask(op, tree_mask, q.size(0), max_q_len, q.device());  // only on the decode path's steps
  check_token_tensor(op, "out", out, q.size(0), q.size(1), s.head_dim, q.scalar_type(), q.device());
  const bool on_cuda = q.is_cuda();

  if (use_decode_path(max_q_len)) {
    const int64_t splits = decode_num_splits(q.device(), s.num_seqs, s.num_kv_heads);
#ifdef TILEINFER_WITH_CUDA
    if (splits == 1 && on_cuda) {  // nothing to merge: no partials, no combine launch
      cuda::decode_single_split(out, s, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len, scale,
                                causal, k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks, tree_mask);
      return;
    }
#endif
    const auto f32 = q.options().dtype(at::kFloat);
    at::Tensor partial_out = at::empty({splits, q.size(0), q.size(1), s.head_dim}, f32);
    at::Tensor partial_lse = at::empty({splits, q.size(0), q.size(1)}, f32);
#ifdef TILEINFER_WITH_CUDA
    if (on_cuda) {
      cuda::decode_as(op, partial_out, partial_lse, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
                      max_q_len, scale, causal, k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks,
                      tree_mask);
      cuda::combine_as(op, out, std::nullopt, partial_out, partial_lse);
      return;
    }
#endif
    cpu::decode_as(op, partial_out, partial_lse, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
                   max_q_len, scale, causal, k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks,
                   tree_mask);
    cpu::combine_as(op, out, std::nullopt, partial_out, partial_lse);
#ifdef TILEINFER_WITH_CUDA
  } else if (on_cuda) {
    // A step with a sequence of more than 16 queries: decode (+ combine) for
    // the sequences of at most 16, prefill for the others (a mixed step:
    // attention_work.cuh); both launches skip the other's sequences.
    const int64_t splits = decode_num_splits(q.device(), s.num_seqs, s.num_kv_heads);
    cuda::decode_mixed(out, s, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, splits, scale, causal,
                       k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks);
    cuda::prefill_long_sequences(out, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len, scale,
                                 causal, k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks);
#endif
  } else {
    cpu::prefill_as(op, out, std::nullopt, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len,
                    scale, causal, k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks);
  }
}

}  // namespace tileinfer

TORCH_LIBRARY_IMPL(tileinfer_attn, CPU, m) { m.impl("attention", &tileinfer::attention); }
#ifdef TILEINFER_WITH_CUDA
TORCH_LIBRARY_IMPL(tileinfer_attn, CUDA, m) { m.impl("attention", &tileinfer::attention); }
#endif
