// C++ signatures of every op implementation, shared by the CPU (csrc/cpu/) and
// CUDA (csrc/ops/) registrations and by the dispatcher in attention.cpp. The
// schemas and the meaning of each argument are in torch_bindings.cpp.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include "tileinfer/decode_splits.h"

#define TILEINFER_DECLARE_OPS                                                              \
  void prefill(at::Tensor& out, const std::optional<at::Tensor>& lse, const at::Tensor& q,  \
               const at::Tensor& k_cache, const at::Tensor& v_cache,                        \
               const at::Tensor& block_tables, const at::Tensor& seq_lens,                  \
               const at::Tensor& cu_seqlens_q, int64_t max_q_len, double scale, bool causal, \
               const std::optional<at::Tensor>& k_scale,                                    \
               const std::optional<at::Tensor>& v_scale,                                    \
               const std::optional<at::Tensor>& k_smooth, int64_t window_left,              \
               double logits_soft_cap, const std::optional<at::Tensor>& sinks,              \
               const std::optional<at::Tensor>& tree_mask);                                 \
  void decode(at::Tensor& partial_out, at::Tensor& partial_lse, const at::Tensor& q,        \
              const at::Tensor& k_cache, const at::Tensor& v_cache,                         \
              const at::Tensor& block_tables, const at::Tensor& seq_lens,                   \
              const at::Tensor& cu_seqlens_q, int64_t max_q_len, double scale, bool causal, \
              const std::optional<at::Tensor>& k_scale,                                     \
              const std::optional<at::Tensor>& v_scale,                                     \
              const std::optional<at::Tensor>& k_smooth, int64_t window_left,               \
              double logits_soft_cap, const std::optional<at::Tensor>& sinks,               \
              const std::optional<at::Tensor>& tree_mask);                                  \
  void combine(at::Tensor& out, const std::optional<at::Tensor>& lse,                       \
               const at::Tensor& partial_out, const at::Tensor& partial_lse);               \
  void rms_norm(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps); \
  void rope(at::Tensor& out, const at::Tensor& x, const at::Tensor& positions,              \
            const at::Tensor& cos_sin_cache, int64_t rotary_dim);                           \
  void cache_write(at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& k,           \
                   const at::Tensor& v, const at::Tensor& block_tables,                     \
                   const at::Tensor& seq_lens, const at::Tensor& cu_seqlens_q,              \
                   const std::optional<at::Tensor>& k_scale,                                \
                   const std::optional<at::Tensor>& v_scale,                                \
                   const std::optional<at::Tensor>& k_smooth);                              \
  void attention_inputs(at::Tensor& q_out, at::Tensor& k_cache, at::Tensor& v_cache,        \
                        const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,      \
                        const at::Tensor& block_tables, const at::Tensor& seq_lens,         \
                        const at::Tensor& cu_seqlens_q, const at::Tensor& cos_sin_cache,    \
                        int64_t rotary_dim, const std::optional<at::Tensor>& q_norm_weight, \
                        const std::optional<at::Tensor>& k_norm_weight, double eps,         \
                        const std::optional<at::Tensor>& k_scale,                           \
                        const std::optional<at::Tensor>& v_scale,                           \
                        const std::optional<at::Tensor>& k_smooth,                          \
                        const std::optional<at::Tensor>& positions);

// prefill, decode and combine under the caller's op name (`op`, first in every
// error message): the attention op runs them as "attention", so that an error
// raised inside names the op the user called.
#define TILEINFER_DECLARE_NAMED_OPS                                                        \
  void prefill_as(const char* op, at::Tensor& out, const std::optional<at::Tensor>& lse,    \
                  const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, \
                  const at::Tensor& block_tables, const at::Tensor& seq_lens,               \
                  const at::Tensor& cu_seqlens_q, int64_t max_q_len, double scale,          \
                  bool causal, const std::optional<at::Tensor>& k_scale,                    \
                  const std::optional<at::Tensor>& v_scale,                                 \
                  const std::optional<at::Tensor>& k_smooth, int64_t window_left,           \
                  double logits_soft_cap, const std::optional<at::Tensor>& sinks);           \
  void decode_as(const char* op, at::Tensor& partial_out, at::Tensor& partial_lse,          \
                 const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, \
                 const at::Tensor& block_tables, const at::Tensor& seq_lens,                \
                 const at::Tensor& cu_seqlens_q, int64_t max_q_len, double scale,           \
                 bool causal, const std::optional<at::Tensor>& k_scale,                     \
                 const std::optional<at::Tensor>& v_scale,                                  \
                 const std::optional<at::Tensor>& k_smooth, int64_t window_left,            \
                 double logits_soft_cap, const std::optional<at::Tensor>& sinks,            \
                 const std::optional<at::Tensor>& tree_mask, const DecodePlan& plan);       \
  void combine_as(const char* op, at::Tensor& out, const std::optional<at::Tensor>& lse,    \
                  const at::Tensor& partial_out, const at::Tensor& partial_lse,             \
                  bool lse_gated);

namespace tileinfer {
struct PagedShape;  // checks.h

// The CPU and CUDA implementations have the same signatures: one list, two namespaces.
namespace cpu {
TILEINFER_DECLARE_OPS
TILEINFER_DECLARE_NAMED_OPS
}  // namespace cpu
namespace cuda {
TILEINFER_DECLARE_OPS
TILEINFER_DECLARE_NAMED_OPS
// Whether the attention op's decode step runs its 2 splits (the default
// rule's count) as clusters of blocks that merge them in shared memory
// (cluster_merge.cuh), the bits combine would give: for 16-bit queries on
// compute capability 9.0 with sm_90a code in the build, unless
// TILEINFER_DECODE_CLUSTER_MERGE=0.
bool decode_merges_in_clusters(const DecodePlan& plan, const at::Tensor& q);
// Whether the attention op's decode step under a batch-invariant plan runs
// without partials: one block per (sequence, KV head) walks all of its
// splits and merges them itself (attention_kernel.cuh), the bits combine
// would give (split_merge.cuh). For 16-bit queries whose group fits the
// 16-row tile at head dims up to 128, when the plan gives each (sequence, KV
// head) one block (grid_splits 1: the default rule's count, or
// decode_plan_one_block's below).
bool decode_merges_splits(const DecodePlan& plan, const PagedShape& s, const at::Tensor& q);
// The attention op's decode step under a batch-invariant plan whose default
// rule gives each (sequence, KV head) two blocks: one block instead where
// that block can merge the splits (decode_merges_splits), unless
// TILEINFER_INVARIANT_ONE_BLOCK=0 (a measurement). Same bits either way.
DecodePlan decode_plan_one_block(const DecodePlan& plan, const PagedShape& s, const at::Tensor& q);
// The attention op's decode step when it has one split, or two merged in
// clusters (decode_merges_in_clusters), or all merged by the block that
// walks them (decode_merges_splits): the decode kernel writes `out` itself,
// the bits that decode + combine would give. The arguments were checked by
// the caller (attention), which passes their shape.
void decode_without_partials(at::Tensor& out, const PagedShape& s, const at::Tensor& q, const at::Tensor& k_cache,
                             const at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                             const at::Tensor& cu_seqlens_q, int64_t max_q_len, double scale, bool causal,
                             const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                             const std::optional<at::Tensor>& k_smooth, int64_t window_left, double logits_soft_cap,
                             const std::optional<at::Tensor>& sinks, const std::optional<at::Tensor>& tree_mask,
                             const DecodePlan& plan);
// A mixed step (attention_work.cuh, "Mixed steps"; max_q_len > 16): the
// decode kernel over the sequences of at most kMaxDecodeQueries queries,
// writing their rows of out itself (splits == 1) or through slot partials
// (from mixed_partials, allocated on the current stream before the step's
// launches: the decodes may run on another stream) and combine_slots.
// prefill_long_sequences runs the prefill kernel over the other sequences, and
// `decodes` (which enqueues decode_mixed on the current stream) beside it or
// before it (prefill.cu, "Mixed steps beside their decodes"). Checked by the
// caller.
struct MixedPartials {
  at::Tensor out, lse;  // undefined with one split
};
MixedPartials mixed_partials(const PagedShape& s, const at::Tensor& q, const DecodePlan& plan);
void decode_mixed(at::Tensor& out, const PagedShape& s, const at::Tensor& q, const at::Tensor& k_cache,
                  const at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                  const at::Tensor& cu_seqlens_q, const DecodePlan& plan, const MixedPartials& partials,
                  double scale, bool causal, const std::optional<at::Tensor>& k_scale,
                  const std::optional<at::Tensor>& v_scale, const std::optional<at::Tensor>& k_smooth,
                  int64_t window_left, double logits_soft_cap, const std::optional<at::Tensor>& sinks);
void combine_slots(at::Tensor& out, const at::Tensor& partial_out, const at::Tensor& partial_lse,
                   const at::Tensor& cu_seqlens_q, int64_t num_tokens, int64_t mixed_queries, bool lse_gated);
void prefill_long_sequences(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                            const at::Tensor& cu_seqlens_q, int64_t max_q_len, double scale, bool causal,
                            const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                            const std::optional<at::Tensor>& k_smooth, int64_t window_left,
                            double logits_soft_cap, const std::optional<at::Tensor>& sinks,
                            bool batch_invariant, const std::function<void()>& decodes);
}  // namespace cuda

// attention: decode + combine or prefill, chosen from shapes only (same choice
// on every step of a captured graph). Registered for CPU and CUDA.
void attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache,
               const at::Tensor& v_cache, const at::Tensor& block_tables,
               const at::Tensor& seq_lens, const at::Tensor& cu_seqlens_q, int64_t max_q_len,
               double scale, bool causal, const std::optional<at::Tensor>& k_scale,
               const std::optional<at::Tensor>& v_scale, const std::optional<at::Tensor>& k_smooth,
               int64_t window_left, double logits_soft_cap, const std::optional<at::Tensor>& sinks,
               const std::optional<at::Tensor>& tree_mask, bool batch_invariant);

// Multiprocessors of a CUDA device (read once per device), 0 for the CPU.
int64_t sm_count(const at::Device& device);

// The dispatcher's rule, exposed for tests and benchmarks.
bool use_decode_path(int64_t max_q_len);
int64_t decode_num_splits(const at::Device& device, int64_t num_seqs, int64_t num_kv_heads);
// attention's decode plan (tileinfer/decode_splits.h): the split rule above, or
// with batch_invariant the boundaries from each sequence's own length.
DecodePlan attention_decode_plan(const at::Device& device, const PagedShape& s, bool batch_invariant);
// The op decode_num_splits: the same rule (tileinfer/decode_splits.h) for a
// device of num_sms multiprocessors (<= 0: the CPU path), so that Python uses
// this one rule.
int64_t decode_num_splits_op(int64_t num_sms, int64_t num_seqs, int64_t num_kv_heads);
// The ops supported / supported_dtypes: a list of the support table
// (tileinfer/tile_table.h), numbers or dtype names as torch spells them.
std::vector<int64_t> supported_op(c10::string_view what);
std::vector<std::string> supported_dtypes_op(c10::string_view what);
}  // namespace tileinfer
