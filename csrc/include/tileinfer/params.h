// Plain parameter structs (trivially copyable), one per kernel family, filled by the host
// launchers in csrc/ops/ and passed by value to the kernels. No torch headers.
#pragma once

#include <climits>
#include <cstdint>

namespace tileinfer {

// The paged KV cache and the step's sequence metadata (layouts: csrc/torch_bindings.cpp).
// Everything that depends on context length lives on the device and is read by
// the kernels; only shape-like values are host integers.
struct PagedKVParams {
  const void* k_cache;          // [num_pages, num_kv_heads, page_size, head_dim]
  const void* v_cache;          // [num_pages, num_kv_heads, page_size, head_dim]
  const float* k_scale;         // quantized cache only, else null: [num_pages, num_kv_heads, page_size],
  const float* v_scale;         //   or [1] with scale_per_tensor (fp8)
  const float* k_smooth;        // [num_kv_heads, head_dim], quantized cache only, may be null
  const int32_t* block_tables;  // [num_seqs, max_pages] page ids, in order
  const int32_t* seq_lens;      // [num_seqs] positions cached after this step's keys
  const int32_t* cu_seqlens_q;  // [num_seqs + 1] prefix sums of this step's query counts
  int num_seqs;
  int max_pages;                // block_tables.size(1)
  int num_pages;                // pool size, for bounds checks of page ids
  int num_kv_heads;
  int page_size;
  int head_dim;
  bool scale_per_tensor;        // k_scale / v_scale hold one scale each (fp8, vLLM's layout)
};

// Prefill, decode (split partials) and combine.
//
// partial_rows: num_tokens, or num_seqs * mixed_queries in a mixed step
// (row seq * mixed_queries + t: query t of sequence seq).
//
// Partial results (decode splits, and prefill's optional lse) use one format:
// an output normalized by its own softmax sum plus the natural-log
// log-sum-exp of its scaled scores. A split that saw no position writes
// out = 0, lse = -inf (the neutral element of the merge). Merging partials i:
//   M = max_i lse_i;  w_i = exp(lse_i - M);  out = sum_i w_i out_i / sum_i w_i.
// This carries the same information as (accumulator, max, sum) and lets
// combine merge prefill results over disjoint page ranges (cascade) too.
struct AttentionParams {
  PagedKVParams kv;
  const void* q;                // [num_tokens, num_q_heads, head_dim], last dim contiguous
  int64_t q_stride_token, q_stride_head;
  void* out;                    // [num_tokens, num_q_heads, head_dim] (prefill, combine)
  int64_t o_stride_token, o_stride_head;
  float* lse;                   // [num_tokens, num_q_heads] natural log, or null
  float* partial_out;           // [num_splits, partial_rows, num_q_heads, head_dim] (decode)
  float* partial_lse;           // [num_splits, partial_rows, num_q_heads] (decode)
  int num_tokens;
  int num_q_heads;
  int group_size;               // num_q_heads / num_kv_heads
  int max_q_len;                // host upper bound of any sequence's query count
  int num_splits;
  // Decode's split boundaries (decode_splits.h, DecodePlan): a sequence of P
  // pages gets pages_per_split(P, divisor, min_pages) pages a split, with
  // divisor 0 meaning num_splits.
  int split_divisor = 0;
  int split_min_pages = 1;
  // 0, or the partial slots of a batch-invariant plan: then the grid's
  // num_splits blocks of a (sequence, KV head) walk the slots in turn
  // (attention_work.cuh, DecodeWalkWork::next), and combine reads an out only
  // where its lse is finite.
  int split_slots = 0;
  // 0, or decode without partials whose num_splits (2) blocks of a
  // (sequence, KV head, row tile) form a thread-block cluster and merge
  // their splits through each other's shared memory (cluster_merge.cuh);
  // the launch sets the cluster's size.
  int cluster_splits = 0;
  // 0, or a mixed step's threshold q (attention_work.cuh, "Mixed steps"):
  // decode takes the sequences of at most q queries, prefill the others.
  int mixed_queries;
  float scale;                  // softmax scale; kernels fold log2(e) in
  bool causal;
  // Per-layer variants, launch constants (softmax.cuh, attention_work.cuh);
  // their defaults are "off", also for params built with `{}`:
  int window_left = INT_MAX;    // a query at p sees keys >= p - window_left; INT_MAX: no window
  float soft_cap = 0.f;         // scores become soft_cap * tanh(score / soft_cap); 0: off
  const float* sinks = nullptr; // [num_q_heads] sink logits (natural-log units), or null
  // [num_tokens] tree-mask words (decode only): bit j of a token's word lets it
  // see token j of its sequence's step; positions before the step are all
  // visible (attention_work.cuh, tree_first_key). Null: no tree.
  const uint32_t* tree_mask = nullptr;
  bool programmatic;            // launched as a programmatic dependent launch (set by the launcher; see
                                // attention_kernel.cuh: values read before the wait are read again)
};

}  // namespace tileinfer
