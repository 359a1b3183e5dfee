// Argument checks shared by the CPU and CUDA implementations, so that both
// devices reject bad input with the same message. Each check
// names the op, the argument and what was expected.
#pragma once

#include "tileinfer/error.h"
#include <optional>

#include <ATen/core/Tensor.h>

namespace tileinfer {

// Shapes read off a paged cache and its metadata.
struct PagedShape {
  int64_t num_pages = 0;
  int64_t num_kv_heads = 0;
  int64_t page_size = 0;
  int64_t head_dim = 0;
  int64_t num_seqs = 0;
  int64_t max_pages = 0;
  bool quantized = false;         // the pools hold int8 or fp8 (e4m3) with fp32 scales
  bool fp8 = false;               // quantized as float8 e4m3 (else int8)
  bool scale_per_tensor = false;  // fp8: one scale per pool (1 element), else one per vector
  at::ScalarType cache_dtype = at::ScalarType::Undefined;
};

// A token tensor [num_tokens, heads, head_dim] with a contiguous last dim.
// Pass -1 for a size that is not fixed yet.
void check_token_tensor(const char* op, const char* name, const at::Tensor& t,
                        int64_t num_tokens, int64_t heads, int64_t head_dim,
                        at::ScalarType dtype, const at::Device& device);

// Pools, block table, lengths, query offsets and the quantized cache's extras.
PagedShape check_paged_cache(const char* op, const at::Tensor& k_cache, const at::Tensor& v_cache,
                             const at::Tensor& block_tables, const at::Tensor& seq_lens,
                             const at::Tensor& cu_seqlens_q,
                             const std::optional<at::Tensor>& k_scale,
                             const std::optional<at::Tensor>& v_scale,
                             const std::optional<at::Tensor>& k_smooth);

// check_paged_cache plus q (dtype, device, head counts that divide, head dim).
PagedShape check_paged_attention(const char* op, const at::Tensor& q, const at::Tensor& k_cache,
                                 const at::Tensor& v_cache, const at::Tensor& block_tables,
                                 const at::Tensor& seq_lens, const at::Tensor& cu_seqlens_q,
                                 int64_t max_q_len,
                                 const std::optional<at::Tensor>& k_scale,
                                 const std::optional<at::Tensor>& v_scale,
                                 const std::optional<at::Tensor>& k_smooth);

// The per-layer variants of the attention ops: window_left >= -1 (-1: none),
// logits_soft_cap finite and >= 0 (0: none), sinks None or [num_q_heads] fp32,
// contiguous, on `device`.
void check_variants(const char* op, int64_t window_left, double logits_soft_cap,
                    const std::optional<at::Tensor>& sinks, int64_t num_q_heads, const at::Device& device);

// A tree mask (EAGLE-style tree verify): None, or int32 [num_tokens],
// contiguous, on `device`, and only on a step of at most kMaxDecodeQueries
// queries per sequence (max_q_len; trees are for verify steps). Its bits are
// never checked here (that would sync): tileinfer_attn.metadata.tree_mask_words
// builds and validates them on the host, and the kernels read any bits safely.
void check_tree_mask(const char* op, const std::optional<at::Tensor>& tree_mask, int64_t num_tokens,
                     int64_t max_q_len, const at::Device& device);
// prefill takes no tree mask (its steps are longer than a tree's).
void check_no_tree_mask(const char* op, const std::optional<at::Tensor>& tree_mask);

// An lse output [num_tokens, num_q_heads] fp32, contiguous.
void check_lse(const char* op, const char* name, const at::Tensor& lse, int64_t num_tokens, int64_t heads,
               const at::Device& device);

// Decode's partials for queries q: partial_out [num_splits >= 1, num_tokens,
// num_q_heads, head_dim] and partial_lse [num_splits, num_tokens, num_q_heads],
// fp32, contiguous, on q's device.
void check_decode_partials(const char* op, const at::Tensor& partial_out, const at::Tensor& partial_lse,
                           const at::Tensor& q, int64_t head_dim);

// combine's arguments, all fixed by partial_out [num_splits, num_tokens,
// num_q_heads, head_dim]: partial_lse, out (bf16/fp16/fp32 token tensor) and
// the optional lse, on partial_out's device.
void check_combine(const char* op, const at::Tensor& out, const std::optional<at::Tensor>& lse,
                   const at::Tensor& partial_out, const at::Tensor& partial_lse);

// Decode serves steps of 1..kMaxDecodeQueries queries per sequence (plain decode
// and speculative verify); longer steps go to prefill.
constexpr int64_t kMaxDecodeQueries = 16;
void check_decode_max_q_len(const char* op, int64_t max_q_len);

// Value checks that are free only when the metadata is on the host (CPU ops):
// seq_lens within [0, what the block table holds], cu_seqlens_q non-decreasing
// from 0 and within num_tokens, every query count within max_q_len (pass -1 to
// skip that one) and within its sequence's length. Device metadata is never synced for this: the
// kernels clamp instead, and tileinfer_attn.validate_metadata reports.
void check_metadata_values_on_host(const char* op, const PagedShape& s,
                                   const at::Tensor& seq_lens, const at::Tensor& cu_seqlens_q,
                                   int64_t num_tokens, int64_t max_q_len);

// Arguments of the attention-inputs ops (rms_norm, rope, cache_write,
// attention_inputs), shared by both devices.
void check_head_dim(const char* op, const char* name, int64_t d);
void check_float_dtype(const char* op, const char* name, const at::Tensor& t);
// A norm weight [head_dim] of the normalized tensor's dtype.
void check_weight(const char* op, const char* name, const at::Tensor& w, int64_t d, at::ScalarType dtype,
                  const at::Device& device);
// rotary_dim even and <= head_dim; cos_sin_cache [max_position, rotary_dim] fp32.
void check_rotary(const char* op, const at::Tensor& cos_sin_cache, int64_t rotary_dim, int64_t d,
                  const at::Device& device);
// k, v [num_tokens, num_kv_heads, head_dim] for the cache: the pool's dtype, or
// bfloat16 / float16 for a quantized pool (quantized on write). Returns their dtype.
at::ScalarType check_kv_inputs(const char* op, const PagedShape& s, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& k_cache);
// x [num_tokens, num_heads, head_dim] (float dtype, supported head dim) and
// out of the same shape and dtype: rms_norm, rope.
void check_rows_io(const char* op, const at::Tensor& out, const at::Tensor& x);
// positions [num_tokens] int32 / int64 on x's device: rope.
void check_positions(const char* op, const at::Tensor& positions, const at::Tensor& x);
// A measurement switch read from the environment at each call (so a captured
// graph keeps the value of its capture): `unset` without the variable, false
// for the value `off`, true for `on`; any other value is an error naming both.
bool env_switch(const char* name, const char* off, const char* on, bool unset);
// A measurement setting read the same way: `unset` without the variable, else
// an integer in [lo, hi] (any other value is an error naming the range).
int64_t env_int(const char* name, int64_t lo, int64_t hi, int64_t unset);
// Every argument of attention_inputs but the metadata values; returns the
// cache's shape and the dtype of q / k / v.
struct InputsShape {
  PagedShape cache;
  at::ScalarType dtype;
};
InputsShape check_attention_inputs(const char* op, const at::Tensor& q_out, const at::Tensor& k_cache,
                                   const at::Tensor& v_cache, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                   const at::Tensor& cu_seqlens_q, const at::Tensor& cos_sin_cache,
                                   int64_t rotary_dim, const std::optional<at::Tensor>& q_norm_weight,
                                   const std::optional<at::Tensor>& k_norm_weight,
                                   const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                                   const std::optional<at::Tensor>& k_smooth,
                                   const std::optional<at::Tensor>& positions);

}  // namespace tileinfer
