// The attention op: picks decode + combine, or for a step with longer
// sequences decode for its short sequences and prefill for the others, from
// shapes alone, so a captured CUDA graph takes the same path on every step, and
// runs them under its own name (errors raised inside name `attention`). The same code serves CPU
// and CUDA. Also the ops that answer questions about the build: the split rule
// (decode_num_splits) and the support table (supported, supported_dtypes).
#include <algorithm>
#include <cstdlib>
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
// (any group: 7 heads of one query fill 7 of a 16-row tile, 32 heads two of
// them, 64 rows the larger tile); beyond 16 queries per sequence the prefill
// kernel is the better (and the supported) path.
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

namespace {

// The batch-invariant plan's shortest split, in positions: 256, or for a
// measurement TILEINFER_INVARIANT_SPLIT_POSITIONS (64 to 4096; read at each
// call, so a captured graph keeps the value of its capture).
int64_t invariant_split_positions() {
  return env_int("TILEINFER_INVARIANT_SPLIT_POSITIONS", 64, 4096, kInvariantSplitPositions);
}

}  // namespace

DecodePlan attention_decode_plan(const at::Device& device, const PagedShape& s, bool batch_invariant) {
  const DecodePlan plan = decode_plan_for(sm_count(device), s.num_seqs, s.num_kv_heads);
  if (!batch_invariant) return plan;
  return invariant_decode_plan(s.max_pages, s.page_size, plan.num_splits, invariant_split_positions());
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

namespace {

// The CPU path of a mixed step, after prefill has written every row: the
// sequences of at most kMaxDecodeQueries queries again on the decode path, as
// the CUDA path runs them, so that their rows are the bits of a decode step
// (batch invariance: a sequence's path does not depend on the others').
void cpu_mixed_decodes(at::Tensor& out, const PagedShape& s, const at::Tensor& q, const at::Tensor& k_cache,
                       const at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                       const at::Tensor& cu_seqlens_q, double scale, bool causal,
                       const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                       const std::optional<at::Tensor>& k_smooth, int64_t window_left, double logits_soft_cap,
                       const std::optional<at::Tensor>& sinks, const DecodePlan& plan) {
  const int64_t num_tokens = q.size(0);
  const int32_t* cu = cu_seqlens_q.data_ptr<int32_t>();
  std::vector<int64_t> seqs, tokens;
  std::vector<int32_t> cu_short{0};
  int64_t max_short = 0;
  for (int64_t i = 0; i < s.num_seqs; ++i) {
    const int64_t b = std::clamp<int64_t>(cu[i], 0, num_tokens);
    const int64_t e = std::clamp<int64_t>(cu[i + 1], b, num_tokens);
    if (e - b < 1 || e - b > kMaxDecodeQueries) continue;
    seqs.push_back(i);
    for (int64_t t = b; t < e; ++t) tokens.push_back(t);
    cu_short.push_back(static_cast<int32_t>(tokens.size()));
    max_short = std::max(max_short, e - b);
  }
  if (seqs.empty()) return;
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  const at::Tensor seq_idx = at::tensor(seqs, i64), tok_idx = at::tensor(tokens, i64);
  const at::Tensor q_short = q.index_select(0, tok_idx);
  const auto f32 = q.options().dtype(at::kFloat);
  const int64_t n = q_short.size(0);
  at::Tensor partial_out = at::empty({plan.num_splits, n, q.size(1), s.head_dim}, f32);
  at::Tensor partial_lse = at::empty({plan.num_splits, n, q.size(1)}, f32);
  cpu::decode_as("attention", partial_out, partial_lse, q_short, k_cache, v_cache,
                 block_tables.index_select(0, seq_idx), seq_lens.index_select(0, seq_idx),
                 at::tensor(cu_short, cu_seqlens_q.options()), max_short, scale, causal, k_scale, v_scale, k_smooth,
                 window_left, logits_soft_cap, sinks, std::nullopt, plan);
  at::Tensor out_short = at::empty_like(q_short);
  cpu::combine_as("attention", out_short, std::nullopt, partial_out, partial_lse, plan.batch_invariant);
  out.index_copy_(0, tok_idx, out_short);
}

}  // namespace

void attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
               const at::Tensor& block_tables, const at::Tensor& seq_lens, const at::Tensor& cu_seqlens_q,
               int64_t max_q_len, double scale, bool causal, const std::optional<at::Tensor>& k_scale,
               const std::optional<at::Tensor>& v_scale, const std::optional<at::Tensor>& k_smooth,
               int64_t window_left, double logits_soft_cap, const std::optional<at::Tensor>& sinks,
               const std::optional<at::Tensor>& tree_mask, bool batch_invariant) {
  const char* op = "attention";
  const PagedShape s = check_paged_attention(op, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
                                             max_q_len, k_scale, v_scale, k_smooth);
  check_variants(op, window_left, logits_soft_cap, sinks, q.size(1), q.device());
  check_tree_mask(op, tree_mask, q.size(0), max_q_len, q.device());  // only on the decode path's steps
  check_token_tensor(op, "out", out, q.size(0), q.size(1), s.head_dim, q.scalar_type(), q.device());
  const bool on_cuda = q.is_cuda();

  // Batch invariance (docs/CONTRACT.md, "Numerics"): each sequence's decode
  // splits from its own length and tiles from the group size (DecodePlan);
  // the prefill kernels' work items already hold all of a row's keys.
  DecodePlan plan = attention_decode_plan(q.device(), s, batch_invariant);
  if (use_decode_path(max_q_len)) {
#ifdef TILEINFER_WITH_CUDA
    if (on_cuda) plan = cuda::decode_plan_one_block(plan, s, q);
    // Nothing to merge, or the blocks of a cluster merge their splits, or
    // one block walks and merges all of a sequence's splits: no partials, no
    // combine launch.
    if (on_cuda && (plan.num_splits == 1 || cuda::decode_merges_in_clusters(plan, q) ||
                    cuda::decode_merges_splits(plan, s, q))) {
      cuda::decode_without_partials(out, s, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len,
                                    scale, causal, k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks,
                                    tree_mask, plan);
      return;
    }
#endif
    const auto f32 = q.options().dtype(at::kFloat);
    at::Tensor partial_out = at::empty({plan.num_splits, q.size(0), q.size(1), s.head_dim}, f32);
    at::Tensor partial_lse = at::empty({plan.num_splits, q.size(0), q.size(1)}, f32);
#ifdef TILEINFER_WITH_CUDA
    if (on_cuda) {
      cuda::decode_as(op, partial_out, partial_lse, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
                      max_q_len, scale, causal, k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks,
                      tree_mask, plan);
      cuda::combine_as(op, out, std::nullopt, partial_out, partial_lse, plan.batch_invariant);
      return;
    }
#endif
    cpu::decode_as(op, partial_out, partial_lse, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
                   max_q_len, scale, causal, k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks,
                   tree_mask, plan);
    cpu::combine_as(op, out, std::nullopt, partial_out, partial_lse, plan.batch_invariant);
#ifdef TILEINFER_WITH_CUDA
  } else if (on_cuda) {
    // A step with a sequence of more than 16 queries: decode (+ combine) for
    // the sequences of at most 16, prefill for the others (a mixed step:
    // attention_work.cuh); both launches skip the other's sequences.
    const cuda::MixedPartials partials = cuda::mixed_partials(s, q, plan);
    const std::function<void()> decodes = [&] {
      cuda::decode_mixed(out, s, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, plan, partials, scale,
                         causal, k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks);
    };
    cuda::prefill_long_sequences(out, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len, scale,
                                 causal, k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks,
                                 batch_invariant, decodes);
#endif
  } else {
    cpu::prefill_as(op, out, std::nullopt, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len,
                    scale, causal, k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks);
    cpu_mixed_decodes(out, s, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale, causal, k_scale,
                      v_scale, k_smooth, window_left, logits_soft_cap, sinks, plan);
  }
}

}  // namespace tileinfer

TORCH_LIBRARY_IMPL(tileinfer_attn, CPU, m) { m.impl("attention", &tileinfer::attention); }
#ifdef TILEINFER_WITH_CUDA
TORCH_LIBRARY_IMPL(tileinfer_attn, CUDA, m) { m.impl("attention", &tileinfer::attention); }
#endif
