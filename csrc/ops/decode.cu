// CUDA implementation of `decode`: split-KV attention for
// steps of a few queries per sequence, GQA-packed. The tensor-core tile kernel
// (attention_kernel.cuh) with the decode work mapping for bf16 / fp16 (and
// int8 / fp8 caches), the
// CUDA-core kernel (attention_fp32.cuh) for fp32. Each block writes one
// normalized fp32 partial + lse per row; `combine` merges the splits. With a
// single split, or two that the decode blocks merge themselves, the attention
// op has them write the output directly (decode_without_partials).
#include <cstdlib>
#include <limits>
#include <optional>
#include <type_traits>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "attention_host.h"
#include "checks.h"
#include "ops.h"
#include "tileinfer/decode_tiles.cuh"
#include "tileinfer/dispatch.h"

namespace tileinfer::cuda {
namespace {

// The tree mask's words for the kernels (checked: int32 [num_tokens]), or null.
const uint32_t* tree_words(const std::optional<at::Tensor>& tree_mask) {
  return tree_mask.has_value() ? reinterpret_cast<const uint32_t*>(tree_mask->data_ptr<int32_t>()) : nullptr;
}

// The decode tiles of a quantized (int8 / fp8) cache for queries of type T.
// A function template, so that `if constexpr` keeps fp32 queries (which a
// quantized cache never takes: checked) from instantiating them; in the
// dispatch macros' plain lambdas it would not.
// Work: DecodeWork, or DecodeWalkWork (a batch-invariant plan's blocks walk
// its splits; never the wide tile).
template <typename T, int D, class Work>
void launch_decode_quant(const char* op, const AttentionParams& p, const PagedShape& s, bool small, bool two_per_sm,
                         cudaStream_t stream) {
  if constexpr (!std::is_same_v<T, float>) {
    TILEINFER_DISPATCH_QUANT(s.cache_dtype, op, [&] {
      if constexpr (D <= 128 && !Work::kWalks) {
        if (small && two_per_sm) return launch_tile<DecodeTileQuantWide<T, D, cache_t>, Work>(op, p, stream);
      }
      if (small) return launch_tile<DecodeTileSmall<T, D, cache_t>, Work>(op, p, stream);
      launch_tile<DecodeTileLarge<T, D, cache_t>, Work>(op, p, stream);
    });
  }
}

// The decode kernel for queries of type T at tile dim D.
template <typename T, int D, class Work>
void launch_decode_tile(const char* op, const AttentionParams& p, const PagedShape& s, bool small, bool two_per_sm,
                        cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    launch_fp32<D, DecodeWork>(op, p, stream);  // (never walks: launch_decode)
  } else if (s.quantized) {
    launch_decode_quant<T, D, Work>(op, p, s, small, two_per_sm, stream);
  } else if (small) {
    launch_tile<DecodeTileSmall<T, D>, Work>(op, p, stream);
  } else {
    launch_tile<DecodeTileLarge<T, D>, Work>(op, p, stream);
  }
}

// Whether a decode launch of `rows` packed rows (group x queries) whose tile
// follows them (not a mixed step's or a batch-invariant plan's, which follow
// the group) takes the 16-row tile, a block per 16 rows with all four warps
// on key slices; `fits`: whether its blocks on that tile fit two per SM. Up
// to 16 rows, always.
// Past 32, the 64-row tile (one warp per 16 rows), which reads the pages
// once: a 16-query verify of group 4 (64 rows) takes twice as long on the
// 16-row tile. Of 17-32 rows (MQA's 32 heads of a query, an 8-query verify
// at group 4) the 16-row tile's second block per split reads the split's
// pages again (through L2) and doubles the blocks that the split rule sized
// for one wave of two per SM (decode_splits.h), so it takes them only where
// those blocks still fit that wave, which leaves one (sequence, KV head)
// pair: one MQA sequence at 4k / 32k positions takes 9-10% less time on it
// than on the 64-row tile, which leaves two of four warps idle (a quantized
// cache: 28-39% less). 4 or 32 MQA sequences and 8-query verifies at group
// 4, of one sequence or more, take 20-28% less time on the 64-row tile (a
// quantized cache 3-7% at 32 MQA sequences; one H200, docs/PERFORMANCE.md).
// TILEINFER_DECODE_ROW_TILE=16 or 64 (read at each call: a captured graph
// keeps the tile of its capture) puts every launch of more than 16 rows on
// that tile instead, for a measurement.
bool decode_small_tile(int64_t rows, bool fits) {
  if (rows <= 16) return true;
  constexpr const char* kName = "TILEINFER_DECODE_ROW_TILE";
  if (std::getenv(kName) != nullptr) return env_switch(kName, "64", "16", false);
  return rows <= 32 && fits;
}

// Launches the decode kernel for p (partials or, with p.partial_out null, `out`
// itself); q is made 16-byte aligned here.
void launch_decode(const char* op, AttentionParams& p, const PagedShape& s, const at::Tensor& q,
                   int64_t max_q_len, const DecodePlan& plan) {
  const at::Tensor q_c = aligned_rows(q);
  p.q = q_c.data_ptr();
  p.q_stride_token = q_c.stride(0);
  p.q_stride_head = q_c.stride(1);
  TILEINFER_CHECK(p.group_size * max_q_len < (int64_t(1) << 31), op, ": group size * max_q_len must fit in int32");
  // The tile kernel's blocks walk a batch-invariant plan's splits: grid_splits
  // blocks for num_splits partials, or without partials one block per
  // (sequence, KV head) that merges them (decode_merges_splits); the fp32
  // kernel takes a block per split.
  const bool walks = plan.batch_invariant && q.scalar_type() != at::kFloat &&
                     (p.partial_out != nullptr || plan.num_splits > 1);
  TILEINFER_CHECK(!walks || p.partial_out != nullptr || decode_merges_splits(plan, s, q), op,
                  ": a decode launch without partials merges its splits in one block of the 16-row tile");
  p.num_splits = static_cast<int>(walks ? plan.grid_splits : plan.num_splits);
  p.split_slots = walks ? static_cast<int>(plan.num_splits) : 0;
  // A block per split and no partials: the splits of each (sequence, KV head,
  // row tile) are a cluster that merges them (decode_merges_in_clusters).
  const bool clustered = !walks && p.partial_out == nullptr && plan.num_splits > 1;
  TILEINFER_CHECK(!clustered || decode_merges_in_clusters(plan, q), op,
                  ": a decode launch without partials merges its splits in one cluster");
  p.cluster_splits = clustered ? static_cast<int>(plan.num_splits) : 0;
  p.split_divisor = static_cast<int>(plan.divisor);
  p.split_min_pages = static_cast<int>(plan.min_pages);
  // The 16-row tile when a query's heads fit in it: a mixed step's grid is
  // sized for 16 queries a sequence, but its decodes are mostly single
  // queries, whose one row tile reads the keys once (the other row tiles'
  // blocks find no rows and return). The tiles cut a key tile differently
  // among their warps, so a row's bits follow the tile: a batch-invariant
  // plan takes it from the group size alone, as mixed steps do.
  const bool by_group = p.mixed_queries > 0 || plan.batch_invariant;
  // Blocks of a small-tile launch; do they fit two per SM? A mixed step's or
  // a batch-invariant plan's count one row tile (the others' blocks of a
  // single query find no rows); past 16 rows a launch has one per 16 rows.
  const int64_t rows = p.group_size * max_q_len;
  const int64_t row_tiles = by_group ? 1 : (rows + 15) / 16;
  const int64_t blocks = static_cast<int64_t>(p.num_splits) * s.num_kv_heads * s.num_seqs * row_tiles;
  const bool fits = blocks <= 2 * sm_count(q.device());
  const bool small = by_group ? p.group_size <= 16 : decode_small_tile(rows, fits);
  const bool two_per_sm = !plan.batch_invariant && fits;

  // A mixed step's blocks walk their row tiles (attention_work.cuh, "Mixed
  // steps"); the fp32 kernel has no such loop. Around the quantized tiles it
  // costs up to 124 bytes of spills, which slow real decodes (a 2k chunk
  // with 64 decodes 3-5%), so a quantized step walks only when it holds one
  // sequence: then that sequence is a prompt or chunk (the decode launch
  // finds nothing, and a block per row tile only costs starts: a lone
  // 512-token prompt through `attention` 18-20% less time walking) or a short
  // step under a larger max_q_len (docs/PERFORMANCE.md, "Mixed steps").
  const bool row_walk =
      p.mixed_queries > 0 && !walks && q.scalar_type() != at::kFloat && (!s.quantized || s.num_seqs == 1);

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TILEINFER_DISPATCH_FLOAT(q.scalar_type(), op, [&] {
    TILEINFER_DISPATCH_TILE_DIM(s.head_dim, op, [&] {
      if (walks && !std::is_same_v<scalar_t, float>) {
        launch_decode_tile<scalar_t, TILE_DIM, DecodeWalkWork>(op, p, s, small, two_per_sm, stream);
      } else if (row_walk) {
        launch_decode_tile<scalar_t, TILE_DIM, DecodeRowWalkWork>(op, p, s, small, two_per_sm, stream);
      } else {
        launch_decode_tile<scalar_t, TILE_DIM, DecodeWork>(op, p, s, small, two_per_sm, stream);
      }
    });
  });
}

// Launches decode with its blocks writing `out` (p.partial_out null). A view of
// out whose rows are not 16-byte aligned goes through an aligned copy: an empty
// one when the launch writes every row, a copy of out when rows it does not
// write must keep their contents (a mixed step's prefill rows and padding).
void launch_decode_into(at::Tensor& out, AttentionParams& p, const PagedShape& s, const at::Tensor& q,
                        int64_t max_q_len, const DecodePlan& plan, bool writes_every_row) {
  at::Tensor target =
      writes_every_row && !rows_aligned16(out) ? at::empty_like(out, at::MemoryFormat::Contiguous) : aligned_rows(out);
  p.out = target.data_ptr();
  p.o_stride_token = target.stride(0);
  p.o_stride_head = target.stride(1);
  launch_decode("attention", p, s, q, max_q_len, plan);
  if (!target.is_same(out)) out.copy_(target);
}

// TILEINFER_DECODE_CLUSTER_MERGE=0 turns the cluster merge off, for a
// measurement against partials + combine in one build (read at each call: a
// captured graph keeps the path of its capture).
bool cluster_merge_enabled() { return env_switch("TILEINFER_DECODE_CLUSTER_MERGE", "0", "1", true); }

}  // namespace

bool decode_merges_in_clusters(const DecodePlan& plan, const at::Tensor& q) {
#ifdef TILEINFER_SM90A
  // The merge is sm_90 code (cluster_merge.cuh): on compute capability 9.0,
  // whose kernels this build has as sm_90a code.
  const int device = q.get_device();
  return !plan.batch_invariant && plan.num_splits == 2 && q.scalar_type() != at::kFloat && q.is_cuda() &&
         cached_device_attribute<cudaDevAttrComputeCapabilityMajor>(device) == 9 &&
         cached_device_attribute<cudaDevAttrComputeCapabilityMinor>(device) == 0 && cluster_merge_enabled();
#else
  (void)plan;
  (void)q;
  return false;
#endif
}

bool decode_merges_splits(const DecodePlan& plan, const PagedShape& s, const at::Tensor& q) {
  return plan.batch_invariant && plan.num_splits > 1 && plan.grid_splits == 1 && q.scalar_type() != at::kFloat &&
         q.size(1) / s.num_kv_heads <= 16 && tile_head_dim(s.head_dim) <= 128;
}

// Two blocks a pair (89-132 pairs on 132 SMs) would walk half the splits
// each into partials that combine merges; one block a pair walks them all as
// one key loop and merges them in shared memory, no partials written or read
// (28/4 heads at 32 x 4k: 1.23 -> 1.06x the default rule's time, one H100;
// PERFORMANCE.md, "Decode split counts and batch invariance"). (The switch
// is read at each call: a captured graph keeps the plan of its capture.)
DecodePlan decode_plan_one_block(const DecodePlan& plan, const PagedShape& s, const at::Tensor& q) {
  if (!plan.batch_invariant || plan.grid_splits != 2 ||
      !env_switch("TILEINFER_INVARIANT_ONE_BLOCK", "0", "1", true))
    return plan;
  DecodePlan one = plan;
  one.grid_splits = 1;
  return decode_merges_splits(one, s, q) ? one : plan;
}

void decode_as(const char* op, at::Tensor& partial_out, at::Tensor& partial_lse, const at::Tensor& q,
               const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& block_tables,
               const at::Tensor& seq_lens, const at::Tensor& cu_seqlens_q, int64_t max_q_len, double scale,
               bool causal, const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
               const std::optional<at::Tensor>& k_smooth, int64_t window_left, double logits_soft_cap,
               const std::optional<at::Tensor>& sinks, const std::optional<at::Tensor>& tree_mask,
               const DecodePlan& plan) {
  const PagedShape s = check_paged_attention(op, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
                                             max_q_len, k_scale, v_scale, k_smooth);
  check_variants(op, window_left, logits_soft_cap, sinks, q.size(1), q.device());
  check_decode_max_q_len(op, max_q_len);
  check_tree_mask(op, tree_mask, q.size(0), max_q_len, q.device());
  const int64_t T = q.size(0), H = q.size(1);
  check_decode_partials(op, partial_out, partial_lse, q, s.head_dim);
  TILEINFER_CHECK(partial_out.size(0) <= (int64_t(1) << 31) - 1 && partial_out.numel() < (int64_t(1) << 62),
              op, ": too many splits");
  TILEINFER_CHECK(aligned16(partial_out.data_ptr()), op, ": partial_out must start at a 16-byte aligned address");
  TILEINFER_CHECK(plan.num_splits == partial_out.size(0), op, ": the decode plan has ", plan.num_splits,
                  " splits for ", partial_out.size(0), " partials");

  const c10::cuda::CUDAGuard guard(q.device());
  AttentionParams p = make_attention_params(op, s, q, k_cache, v_cache, block_tables, seq_lens,
                                            cu_seqlens_q, max_q_len, scale, causal, k_scale, v_scale,
                                            k_smooth, window_left, logits_soft_cap, sinks);
  p.tree_mask = tree_words(tree_mask);
  if (T == 0 || H == 0) return;
  if (s.num_seqs == 0 || max_q_len == 0) {
    // No block runs, so no block marks the (all-padding) tokens: give them the
    // neutral partial here, as the kernel would (combine then writes 0).
    partial_lse.fill_(-std::numeric_limits<float>::infinity());
    return;
  }
  p.partial_out = partial_out.data_ptr<float>();
  p.partial_lse = partial_lse.data_ptr<float>();
  launch_decode(op, p, s, q, max_q_len, plan);
}

void decode(at::Tensor& partial_out, at::Tensor& partial_lse, const at::Tensor& q, const at::Tensor& k_cache,
            const at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& seq_lens,
            const at::Tensor& cu_seqlens_q, int64_t max_q_len, double scale, bool causal,
            const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
            const std::optional<at::Tensor>& k_smooth, int64_t window_left, double logits_soft_cap,
            const std::optional<at::Tensor>& sinks, const std::optional<at::Tensor>& tree_mask) {
  const int64_t splits = partial_out.dim() > 0 ? partial_out.size(0) : 1;  // (checked in decode_as)
  decode_as("decode", partial_out, partial_lse, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
            max_q_len, scale, causal, k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks, tree_mask,
            even_decode_plan(splits));
}

void decode_without_partials(at::Tensor& out, const PagedShape& s, const at::Tensor& q, const at::Tensor& k_cache,
                             const at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                             const at::Tensor& cu_seqlens_q, int64_t max_q_len, double scale, bool causal,
                             const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                             const std::optional<at::Tensor>& k_smooth, int64_t window_left, double logits_soft_cap,
                             const std::optional<at::Tensor>& sinks, const std::optional<at::Tensor>& tree_mask,
                             const DecodePlan& plan) {
  const c10::cuda::CUDAGuard guard(q.device());
  AttentionParams p = make_attention_params("attention", s, q, k_cache, v_cache, block_tables, seq_lens,
                                            cu_seqlens_q, max_q_len, scale, causal, k_scale, v_scale,
                                            k_smooth, window_left, logits_soft_cap, sinks);
  p.tree_mask = tree_words(tree_mask);
  if (q.size(0) == 0 || q.size(1) == 0) return;
  if (s.num_seqs == 0 || max_q_len == 0) {  // every token is padding: combine would write 0
    out.zero_();
    return;
  }
  launch_decode_into(out, p, s, q, max_q_len, plan, /*writes_every_row=*/true);
}

MixedPartials mixed_partials(const PagedShape& s, const at::Tensor& q, const DecodePlan& plan) {
  if (plan.num_splits == 1 || q.size(0) == 0 || q.size(1) == 0 || s.num_seqs == 0) return {};
  const int64_t slots = s.num_seqs * kMaxDecodeQueries;
  const auto f32 = q.options().dtype(at::kFloat);
  MixedPartials m{at::empty({plan.num_splits, slots, q.size(1), s.head_dim}, f32),
                  at::empty({plan.num_splits, slots, q.size(1)}, f32)};
  TILEINFER_CHECK(m.out.numel() < (int64_t(1) << 62) && slots * q.size(1) < (int64_t(1) << 31), "attention",
                  ": too many sequences for the decode partials of a mixed step");
  return m;
}

void decode_mixed(at::Tensor& out, const PagedShape& s, const at::Tensor& q, const at::Tensor& k_cache,
                  const at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                  const at::Tensor& cu_seqlens_q, const DecodePlan& plan, const MixedPartials& partials,
                  double scale, bool causal, const std::optional<at::Tensor>& k_scale,
                  const std::optional<at::Tensor>& v_scale, const std::optional<at::Tensor>& k_smooth,
                  int64_t window_left, double logits_soft_cap, const std::optional<at::Tensor>& sinks) {
  const c10::cuda::CUDAGuard guard(q.device());
  // The grid, and the slots, are sized for kMaxDecodeQueries queries a sequence.
  AttentionParams p = make_attention_params("attention", s, q, k_cache, v_cache, block_tables, seq_lens,
                                            cu_seqlens_q, kMaxDecodeQueries, scale, causal, k_scale, v_scale,
                                            k_smooth, window_left, logits_soft_cap, sinks);
  if (q.size(0) == 0 || q.size(1) == 0 || s.num_seqs == 0) return;
  p.mixed_queries = static_cast<int>(kMaxDecodeQueries);
  if (plan.num_splits == 1) {  // the blocks write their (decode) rows of out
    launch_decode_into(out, p, s, q, kMaxDecodeQueries, plan, /*writes_every_row=*/false);
    return;
  }
  p.partial_out = partials.out.data_ptr<float>();
  p.partial_lse = partials.lse.data_ptr<float>();
  launch_decode("attention", p, s, q, kMaxDecodeQueries, plan);
  combine_slots(out, partials.out, partials.lse, cu_seqlens_q, q.size(0), kMaxDecodeQueries, plan.batch_invariant);
}

}  // namespace tileinfer::cuda

TORCH_LIBRARY_IMPL(tileinfer_attn, CUDA, m) { m.impl("decode", &tileinfer::cuda::decode); }
