#include "checks.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "tileinfer/tile_table.h"

namespace tileinfer {
namespace {

// A meta tensor has a shape but no data: only torch.compile's fake
// implementations take those. Checked before the device comparisons, so that a
// meta tensor mixed with real ones is named as such whichever argument it is.
void check_not_meta(const char* op, const char* name, const at::Tensor& t) {
  TILEINFER_CHECK(!t.is_meta(), op, ": ", name,
                  " is on the meta device (a shape without data); the kernels need real tensors, all on one "
                  "device (meta tensors are for torch.compile's fake implementations, never mixed with real ones)");
}

void check_on(const char* op, const char* name, const at::Tensor& t, const at::Device& device) {
  check_not_meta(op, name, t);
  TILEINFER_CHECK(t.device() == device, op, ": ", name, " must be on ", device, " (the device of the cache), got ",
              t.device());
}

void check_int32_vector(const char* op, const char* name, const at::Tensor& t, int64_t size,
                        const at::Device& device) {
  TILEINFER_CHECK(t.scalar_type() == at::kInt, op, ": ", name, " must be int32, got ", t.scalar_type());
  TILEINFER_CHECK(t.dim() == 1, op, ": ", name, " must be 1-D, got shape ", t.sizes());
  TILEINFER_CHECK(t.size(0) == size, op, ": ", name, " must have ", size, " entries, got ", t.size(0));
  TILEINFER_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
  check_on(op, name, t, device);
}

// k_scale / v_scale of a quantized cache: [num_pages, num_kv_heads, page_size]
// (per vector), or for fp8 one element (per tensor, shape [] or [1]).
void check_scale(const char* op, const char* name, const std::optional<at::Tensor>& t,
                 const PagedShape& s, const at::Device& device) {
  const char* cache = dtype_name(s.cache_dtype);
  TILEINFER_CHECK(t.has_value(), op, ": ", name, " is required with a quantized cache (", cache, ": ",
                  s.fp8 ? "[1] float32 per tensor or " : "", "[num_pages, num_kv_heads, page_size] float32)");
  TILEINFER_CHECK(t->scalar_type() == at::kFloat, op, ": ", name, " must be float32, got ", t->scalar_type());
  if (s.scale_per_tensor) {
    TILEINFER_CHECK(t->numel() == 1 && t->dim() <= 1, op, ": ", name,
                    " must have one element (a per-tensor scale, as k_scale), got shape ", t->sizes());
  } else {
    TILEINFER_CHECK(t->dim() == 3 && t->size(0) == s.num_pages && t->size(1) == s.num_kv_heads &&
                        t->size(2) == s.page_size,
                    op, ": ", name, " must have shape [", s.num_pages, ", ", s.num_kv_heads, ", ", s.page_size,
                    "] (num_pages, num_kv_heads, page_size)",
                    !s.fp8 ? "" : std::string(name) == "k_scale" ? " or [1] (per tensor)" : " (per vector, as k_scale)",
                    ", got ", t->sizes());
    TILEINFER_CHECK(t->is_contiguous(), op, ": ", name, " must be contiguous");
  }
  check_on(op, name, *t, device);
}

// partial_out [num_splits, num_tokens, num_q_heads, head_dim] fp32, contiguous.
void check_partial_out(const char* op, const at::Tensor& partial_out) {
  check_not_meta(op, "partial_out", partial_out);
  TILEINFER_CHECK(partial_out.scalar_type() == at::kFloat, op, ": partial_out must be float32, got ",
              partial_out.scalar_type());
  TILEINFER_CHECK(partial_out.dim() == 4, op,
              ": partial_out must be 4-D [num_splits, num_tokens, num_q_heads, head_dim], got shape ",
              partial_out.sizes());
  TILEINFER_CHECK(partial_out.size(0) >= 1, op, ": partial_out must hold at least one split (dim 0)");
  TILEINFER_CHECK(partial_out.is_contiguous(), op, ": partial_out must be contiguous");
}

// partial_lse [num_splits, num_tokens, num_q_heads] fp32, matching partial_out.
void check_partial_lse(const char* op, const at::Tensor& partial_lse, const at::Tensor& partial_out) {
  check_not_meta(op, "partial_lse", partial_lse);
  TILEINFER_CHECK(partial_lse.scalar_type() == at::kFloat, op, ": partial_lse must be float32, got ",
              partial_lse.scalar_type());
  TILEINFER_CHECK(partial_lse.dim() == 3 && partial_lse.sizes() == partial_out.sizes().slice(0, 3), op,
              ": partial_lse must have shape ", partial_out.sizes().slice(0, 3),
              " (num_splits, num_tokens, num_q_heads), got ", partial_lse.sizes());
  TILEINFER_CHECK(partial_lse.is_contiguous(), op, ": partial_lse must be contiguous");
  TILEINFER_CHECK(partial_lse.device() == partial_out.device(), op, ": partial_lse must be on ",
              partial_out.device(), ", got ", partial_lse.device());
}

}  // namespace

void check_token_tensor(const char* op, const char* name, const at::Tensor& t, int64_t num_tokens,
                        int64_t heads, int64_t head_dim, at::ScalarType dtype, const at::Device& device) {
  TILEINFER_CHECK(t.dim() == 3, op, ": ", name, " must be 3-D [num_tokens, num_heads, head_dim], got shape ",
              t.sizes());
  TILEINFER_CHECK(num_tokens < 0 || t.size(0) == num_tokens, op, ": ", name, " must have ", num_tokens,
              " tokens (dim 0), got ", t.size(0));
  TILEINFER_CHECK(heads < 0 || t.size(1) == heads, op, ": ", name, " must have ", heads, " heads (dim 1), got ",
              t.size(1));
  TILEINFER_CHECK(head_dim < 0 || t.size(2) == head_dim, op, ": ", name, " must have head_dim ", head_dim,
              " (dim 2), got ", t.size(2));
  TILEINFER_CHECK(t.scalar_type() == dtype, op, ": ", name, " must be ", dtype, ", got ", t.scalar_type());
  TILEINFER_CHECK(t.size(2) <= 1 || t.stride(2) == 1, op, ": ", name,
              " must have a contiguous last dim (stride 1), got strides ", t.strides());
  check_on(op, name, t, device);
}

void check_lse(const char* op, const char* name, const at::Tensor& lse, int64_t num_tokens, int64_t heads,
               const at::Device& device) {
  check_not_meta(op, name, lse);
  TILEINFER_CHECK(lse.scalar_type() == at::kFloat, op, ": ", name, " must be float32, got ", lse.scalar_type());
  TILEINFER_CHECK(lse.dim() == 2 && lse.size(0) == num_tokens && lse.size(1) == heads, op, ": ", name,
              " must have shape [", num_tokens, ", ", heads, "] (num_tokens, num_q_heads), got ", lse.sizes());
  TILEINFER_CHECK(lse.is_contiguous(), op, ": ", name, " must be contiguous");
  TILEINFER_CHECK(lse.device() == device, op, ": ", name, " must be on ", device, ", got ", lse.device());
}

void check_decode_partials(const char* op, const at::Tensor& partial_out, const at::Tensor& partial_lse,
                           const at::Tensor& q, int64_t head_dim) {
  check_partial_out(op, partial_out);
  TILEINFER_CHECK(partial_out.size(1) == q.size(0) && partial_out.size(2) == q.size(1) &&
                      partial_out.size(3) == head_dim,
                  op, ": partial_out must have shape [num_splits, ", q.size(0), ", ", q.size(1), ", ", head_dim,
                  "] (num_splits, num_tokens, num_q_heads, head_dim), got ", partial_out.sizes());
  TILEINFER_CHECK(partial_out.device() == q.device(), op, ": partial_out must be on ", q.device(), ", got ",
                  partial_out.device());
  check_partial_lse(op, partial_lse, partial_out);
}

void check_combine(const char* op, const at::Tensor& out, const std::optional<at::Tensor>& lse,
                   const at::Tensor& partial_out, const at::Tensor& partial_lse) {
  check_partial_out(op, partial_out);
  check_partial_lse(op, partial_lse, partial_out);
  const int64_t num_tokens = partial_out.size(1), heads = partial_out.size(2), d = partial_out.size(3);
  TILEINFER_CHECK(supported_head_dim(d), op, ": unsupported head_dim ", d, " (dim 3 of partial_out; expected ",
                  expected(kHeadDims), ")");
  TILEINFER_CHECK(float_dtype(out.scalar_type()), op, ": out must be ", expected(kFloatDtypes), ", got ",
                  out.scalar_type());
  check_token_tensor(op, "out", out, num_tokens, heads, d, out.scalar_type(), partial_out.device());
  if (lse.has_value()) check_lse(op, "lse", *lse, num_tokens, heads, partial_out.device());
}

PagedShape check_paged_cache(const char* op, const at::Tensor& k_cache, const at::Tensor& v_cache,
                             const at::Tensor& block_tables, const at::Tensor& seq_lens,
                             const at::Tensor& cu_seqlens_q, const std::optional<at::Tensor>& k_scale,
                             const std::optional<at::Tensor>& v_scale,
                             const std::optional<at::Tensor>& k_smooth) {
  check_not_meta(op, "k_cache", k_cache);
  TILEINFER_CHECK(k_cache.dim() == 4, op,
              ": k_cache must be 4-D [num_pages, num_kv_heads, page_size, head_dim], got shape ",
              k_cache.sizes());
  TILEINFER_CHECK(v_cache.sizes() == k_cache.sizes(), op, ": v_cache must have the shape of k_cache ",
              k_cache.sizes(), ", got ", v_cache.sizes());
  TILEINFER_CHECK(v_cache.scalar_type() == k_cache.scalar_type(), op, ": v_cache must have the dtype of k_cache (",
              k_cache.scalar_type(), "), got ", v_cache.scalar_type());
  TILEINFER_CHECK(k_cache.is_contiguous(), op, ": k_cache must be contiguous");
  TILEINFER_CHECK(v_cache.is_contiguous(), op, ": v_cache must be contiguous");
  const at::Device device = k_cache.device();
  check_on(op, "v_cache", v_cache, device);

  PagedShape s;
  s.num_pages = k_cache.size(0);
  s.num_kv_heads = k_cache.size(1);
  s.page_size = k_cache.size(2);
  s.head_dim = k_cache.size(3);
  s.cache_dtype = k_cache.scalar_type();
  s.quantized = quant_dtype(s.cache_dtype);
  s.fp8 = s.cache_dtype == at::kFloat8_e4m3fn;
  TILEINFER_CHECK(s.cache_dtype != at::kFloat8_e5m2, op,
                  ": k_cache: float8_e5m2 pools are not supported (the fp8 cache is float8_e4m3fn)");
  TILEINFER_CHECK(cache_dtype(s.cache_dtype), op, ": k_cache must be ", expected(kCacheDtypes), ", got ",
                  dtype_name(s.cache_dtype));
  TILEINFER_CHECK(s.num_pages > 0, op, ": k_cache must hold at least one page");
  TILEINFER_CHECK(s.num_kv_heads > 0, op, ": k_cache must have at least one KV head");
  TILEINFER_CHECK(supported_head_dim(s.head_dim), op, ": unsupported head_dim ", s.head_dim, " (expected ",
                  expected(kHeadDims), ")");
  TILEINFER_CHECK(supported_page_size(s.page_size), op, ": unsupported page_size ", s.page_size, " (expected ",
                  expected(kPageSizes), ")");

  TILEINFER_CHECK(block_tables.scalar_type() == at::kInt, op, ": block_tables must be int32, got ",
              block_tables.scalar_type());
  TILEINFER_CHECK(block_tables.dim() == 2, op, ": block_tables must be 2-D [num_seqs, max_pages], got shape ",
              block_tables.sizes());
  TILEINFER_CHECK(block_tables.is_contiguous(), op, ": block_tables must be contiguous");
  TILEINFER_CHECK(block_tables.size(1) > 0, op, ": block_tables must have at least one column");
  check_on(op, "block_tables", block_tables, device);
  s.num_seqs = block_tables.size(0);
  s.max_pages = block_tables.size(1);
  // The kernels compute key positions a few tiles past the end in int32: keep 2^16 of margin.
  TILEINFER_CHECK(s.max_pages * s.page_size <= (int64_t(1) << 31) - (int64_t(1) << 16), op,
              ": block_tables holds too many positions for int32 lengths (max_pages * page_size must be <= 2^31 - 2^16)");
  check_int32_vector(op, "seq_lens", seq_lens, s.num_seqs, device);
  check_int32_vector(op, "cu_seqlens_q", cu_seqlens_q, s.num_seqs + 1, device);

  if (s.quantized) {
    // The scale kind is k_scale's: one element (fp8 only) or one per vector.
    s.scale_per_tensor = s.fp8 && k_scale.has_value() && k_scale->numel() == 1;
    check_scale(op, "k_scale", k_scale, s, device);
    check_scale(op, "v_scale", v_scale, s, device);
    if (k_smooth.has_value()) {
      TILEINFER_CHECK(k_smooth->scalar_type() == at::kFloat, op, ": k_smooth must be float32, got ",
                  k_smooth->scalar_type());
      TILEINFER_CHECK(k_smooth->dim() == 2 && k_smooth->size(0) == s.num_kv_heads && k_smooth->size(1) == s.head_dim,
                  op, ": k_smooth must have shape [", s.num_kv_heads, ", ", s.head_dim,
                  "] (num_kv_heads, head_dim), got ", k_smooth->sizes());
      TILEINFER_CHECK(k_smooth->is_contiguous(), op, ": k_smooth must be contiguous");
      check_on(op, "k_smooth", *k_smooth, device);
    }
  } else {
    TILEINFER_CHECK(!k_scale.has_value() && !v_scale.has_value() && !k_smooth.has_value(), op,
                ": k_scale, v_scale and k_smooth are for a quantized (int8 or float8_e4m3fn) cache only; k_cache is ",
                dtype_name(k_cache.scalar_type()));
  }
  return s;
}

PagedShape check_paged_attention(const char* op, const at::Tensor& q, const at::Tensor& k_cache,
                                 const at::Tensor& v_cache, const at::Tensor& block_tables,
                                 const at::Tensor& seq_lens, const at::Tensor& cu_seqlens_q, int64_t max_q_len,
                                 const std::optional<at::Tensor>& k_scale,
                                 const std::optional<at::Tensor>& v_scale,
                                 const std::optional<at::Tensor>& k_smooth) {
  PagedShape s = check_paged_cache(op, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_scale, v_scale,
                                   k_smooth);
  TILEINFER_CHECK(q.dim() == 3, op, ": q must be 3-D [num_tokens, num_q_heads, head_dim], got shape ", q.sizes());
  if (s.quantized) {
    TILEINFER_CHECK(half_dtype(q.scalar_type()), op, ": with a quantized cache (", dtype_name(s.cache_dtype), ") q must be ", expected(kHalfDtypes),
                    ", got ", q.scalar_type());
  } else {
    TILEINFER_CHECK(q.scalar_type() == k_cache.scalar_type(), op, ": q must have the dtype of k_cache (",
                k_cache.scalar_type(), "), got ", q.scalar_type());
  }
  check_token_tensor(op, "q", q, -1, -1, s.head_dim, q.scalar_type(), k_cache.device());
  TILEINFER_CHECK(q.size(1) % s.num_kv_heads == 0, op, ": num_q_heads (", q.size(1),
              ") must be a multiple of num_kv_heads (", s.num_kv_heads, ")");
  TILEINFER_CHECK(max_q_len >= 0, op, ": max_q_len must be >= 0, got ", max_q_len);
  return s;
}

void check_variants(const char* op, int64_t window_left, double logits_soft_cap,
                    const std::optional<at::Tensor>& sinks, int64_t num_q_heads, const at::Device& device) {
  TILEINFER_CHECK(window_left >= -1, op,
                  ": window_left must be >= 0 (keys a query sees to its left) or -1 (no window), got ", window_left);
  // Finite in fp32 too: the kernels hold it as a float.
  TILEINFER_CHECK(std::isfinite(static_cast<float>(logits_soft_cap)) && logits_soft_cap >= 0, op,
                  ": logits_soft_cap must be a finite number >= 0 (0: no soft-cap), got ", logits_soft_cap);
  if (!sinks.has_value()) return;
  check_not_meta(op, "sinks", *sinks);
  TILEINFER_CHECK(sinks->scalar_type() == at::kFloat, op, ": sinks must be float32, got ", sinks->scalar_type());
  TILEINFER_CHECK(sinks->dim() == 1 && sinks->size(0) == num_q_heads, op, ": sinks must have shape [", num_q_heads,
                  "] (num_q_heads), got ", sinks->sizes());
  TILEINFER_CHECK(sinks->is_contiguous(), op, ": sinks must be contiguous");
  TILEINFER_CHECK(sinks->device() == device, op, ": sinks must be on ", device, " (the device of the cache), got ",
                  sinks->device());
}

void check_tree_mask(const char* op, const std::optional<at::Tensor>& tree_mask, int64_t num_tokens,
                     int64_t max_q_len, const at::Device& device) {
  if (!tree_mask.has_value()) return;
  TILEINFER_CHECK(max_q_len <= kMaxDecodeQueries, op, ": tree_mask is for steps of at most ", kMaxDecodeQueries,
                  " queries per sequence (tree verify), got max_q_len = ", max_q_len);
  check_not_meta(op, "tree_mask", *tree_mask);
  TILEINFER_CHECK(tree_mask->scalar_type() == at::kInt, op, ": tree_mask must be int32, got ",
                  tree_mask->scalar_type());
  TILEINFER_CHECK(tree_mask->dim() == 1 && tree_mask->size(0) == num_tokens, op, ": tree_mask must have shape [",
                  num_tokens, "] (num_tokens), got ", tree_mask->sizes());
  TILEINFER_CHECK(tree_mask->is_contiguous(), op, ": tree_mask must be contiguous");
  TILEINFER_CHECK(tree_mask->device() == device, op, ": tree_mask must be on ", device,
                  " (the device of the cache), got ", tree_mask->device());
}

void check_no_tree_mask(const char* op, const std::optional<at::Tensor>& tree_mask) {
  TILEINFER_CHECK(!tree_mask.has_value(), op, ": tree_mask is not supported here: tree verify steps (at most ",
                  kMaxDecodeQueries, " queries per sequence) run on decode or attention");
}

void check_decode_max_q_len(const char* op, int64_t max_q_len) {
  TILEINFER_CHECK(max_q_len <= kMaxDecodeQueries, op, ": max_q_len must be at most ", kMaxDecodeQueries,
                  " (decode serves steps of 1-16 queries per sequence; use prefill), got ", max_q_len);
}

void check_metadata_values_on_host(const char* op, const PagedShape& s, const at::Tensor& seq_lens,
                                   const at::Tensor& cu_seqlens_q, int64_t num_tokens, int64_t max_q_len) {
  if (!seq_lens.device().is_cpu()) return;
  const int64_t cap = s.max_pages * s.page_size;
  const int32_t* len = seq_lens.data_ptr<int32_t>();
  const int32_t* cu = cu_seqlens_q.data_ptr<int32_t>();
  TILEINFER_CHECK(cu[0] == 0, op, ": cu_seqlens_q[0] must be 0, got ", cu[0]);
  for (int64_t i = 0; i < s.num_seqs; ++i) {
    TILEINFER_CHECK(len[i] >= 0 && len[i] <= cap, op, ": seq_lens[", i, "] = ", len[i],
                " is outside [0, ", cap, "] (max_pages * page_size: what block_tables can hold)");
    TILEINFER_CHECK(cu[i + 1] >= cu[i], op, ": cu_seqlens_q must be non-decreasing, got cu_seqlens_q[", i + 1,
                "] = ", cu[i + 1], " < ", cu[i]);
    TILEINFER_CHECK(cu[i + 1] - cu[i] <= len[i], op, ": sequence ", i, " has ", cu[i + 1] - cu[i],
                " queries this step but seq_lens[", i, "] = ", len[i],
                " (seq_lens counts the positions cached after this step's keys)");
    TILEINFER_CHECK(max_q_len < 0 || cu[i + 1] - cu[i] <= max_q_len, op, ": sequence ", i, " has ",
                cu[i + 1] - cu[i], " queries this step, more than max_q_len = ", max_q_len);
  }
  TILEINFER_CHECK(cu[s.num_seqs] <= num_tokens, op, ": cu_seqlens_q[-1] = ", cu[s.num_seqs],
              " exceeds the number of tokens (", num_tokens, ")");
}

// ---- arguments of the attention-inputs ops (rms_norm, rope, cache_write, attention_inputs)

void check_head_dim(const char* op, const char* name, int64_t d) {
  TILEINFER_CHECK(supported_head_dim(d), op, ": unsupported head_dim ", d, " of ", name, " (expected ",
                  expected(kHeadDims), ")");
}

void check_float_dtype(const char* op, const char* name, const at::Tensor& t) {
  TILEINFER_CHECK(float_dtype(t.scalar_type()), op, ": ", name, " must be ", expected(kFloatDtypes), ", got ",
                  t.scalar_type());
}

// A norm weight [head_dim] of x's dtype.
void check_weight(const char* op, const char* name, const at::Tensor& w, int64_t d, at::ScalarType dtype,
                  const at::Device& device) {
  check_not_meta(op, name, w);
  TILEINFER_CHECK(w.dim() == 1 && w.size(0) == d, op, ": ", name, " must have shape [", d, "] (head_dim), got ",
              w.sizes());
  TILEINFER_CHECK(w.scalar_type() == dtype, op, ": ", name, " must have the dtype of the normalized tensor (", dtype,
              "), got ", w.scalar_type());
  TILEINFER_CHECK(w.is_contiguous(), op, ": ", name, " must be contiguous");
  TILEINFER_CHECK(w.device() == device, op, ": ", name, " must be on ", device, ", got ", w.device());
}

void check_rotary(const char* op, const at::Tensor& cos_sin_cache, int64_t rotary_dim, int64_t d,
                  const at::Device& device) {
  check_not_meta(op, "cos_sin_cache", cos_sin_cache);
  TILEINFER_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= d, op,
              ": rotary_dim must be even and in [2, head_dim = ", d, "], got ", rotary_dim);
  TILEINFER_CHECK(cos_sin_cache.scalar_type() == at::kFloat, op, ": cos_sin_cache must be float32, got ",
              cos_sin_cache.scalar_type());
  TILEINFER_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.size(1) == rotary_dim, op,
              ": cos_sin_cache must have shape [max_position, ", rotary_dim, "] (cos then sin), got ",
              cos_sin_cache.sizes());
  TILEINFER_CHECK(cos_sin_cache.is_contiguous(), op, ": cos_sin_cache must be contiguous");
  TILEINFER_CHECK(cos_sin_cache.device() == device, op, ": cos_sin_cache must be on ", device, ", got ",
              cos_sin_cache.device());
}

// k, v [num_tokens, num_kv_heads, head_dim] for the cache: the pool's dtype,
// or bfloat16 / float16 for a quantized pool (quantized on write).
at::ScalarType check_kv_inputs(const char* op, const PagedShape& s, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& k_cache) {
  TILEINFER_CHECK(k.dim() == 3, op, ": k must be 3-D [num_tokens, num_kv_heads, head_dim], got shape ", k.sizes());
  at::ScalarType dtype = k_cache.scalar_type();
  if (s.quantized) {
    TILEINFER_CHECK(half_dtype(k.scalar_type()), op, ": with a quantized cache (", dtype_name(s.cache_dtype), ") k must be ", expected(kHalfDtypes),
                    ", got ", k.scalar_type());
    dtype = k.scalar_type();
  }
  check_token_tensor(op, "k", k, -1, s.num_kv_heads, s.head_dim, dtype, k_cache.device());
  check_token_tensor(op, "v", v, k.size(0), s.num_kv_heads, s.head_dim, dtype, k_cache.device());
  return dtype;
}

void check_rows_io(const char* op, const at::Tensor& out, const at::Tensor& x) {
  TILEINFER_CHECK(x.dim() == 3, op, ": x must be 3-D [num_tokens, num_heads, head_dim], got shape ", x.sizes());
  check_float_dtype(op, "x", x);
  check_head_dim(op, "x", x.size(2));
  check_token_tensor(op, "x", x, -1, -1, -1, x.scalar_type(), x.device());
  check_token_tensor(op, "out", out, x.size(0), x.size(1), x.size(2), x.scalar_type(), x.device());
}

void check_positions(const char* op, const at::Tensor& positions, const at::Tensor& x) {
  check_not_meta(op, "positions", positions);
  TILEINFER_CHECK(positions.scalar_type() == at::kInt || positions.scalar_type() == at::kLong, op,
                  ": positions must be int32 or int64, got ", positions.scalar_type());
  TILEINFER_CHECK(positions.dim() == 1 && positions.size(0) == x.size(0), op, ": positions must have shape [",
                  x.size(0), "] (num_tokens), got ", positions.sizes());
  TILEINFER_CHECK(positions.device() == x.device(), op, ": positions must be on ", x.device(), ", got ",
                  positions.device());
}

InputsShape check_attention_inputs(const char* op, const at::Tensor& q_out, const at::Tensor& k_cache,
                                   const at::Tensor& v_cache, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                   const at::Tensor& cu_seqlens_q, const at::Tensor& cos_sin_cache,
                                   int64_t rotary_dim, const std::optional<at::Tensor>& q_norm_weight,
                                   const std::optional<at::Tensor>& k_norm_weight,
                                   const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                                   const std::optional<at::Tensor>& k_smooth,
                                   const std::optional<at::Tensor>& positions) {
  const PagedShape s =
      check_paged_cache(op, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_scale, v_scale, k_smooth);
  const at::ScalarType dtype = check_kv_inputs(op, s, k, v, k_cache);
  const int64_t d = s.head_dim;
  check_token_tensor(op, "q", q, k.size(0), -1, d, dtype, k_cache.device());
  check_token_tensor(op, "q_out", q_out, q.size(0), q.size(1), d, dtype, k_cache.device());
  if (q_norm_weight.has_value()) check_weight(op, "q_norm_weight", *q_norm_weight, d, dtype, k_cache.device());
  if (k_norm_weight.has_value()) check_weight(op, "k_norm_weight", *k_norm_weight, d, dtype, k_cache.device());
  check_rotary(op, cos_sin_cache, rotary_dim, d, k_cache.device());
  if (positions.has_value()) {
    check_positions(op, *positions, q);
    TILEINFER_CHECK(positions->is_contiguous(), op, ": positions must be contiguous");
  }
  return {s, dtype};
}

bool env_switch(const char* name, const char* off, const char* on, bool unset) {
  const char* env = std::getenv(name);
  if (env == nullptr) return unset;
  const bool is_on = std::strcmp(env, on) == 0;
  TILEINFER_CHECK(is_on || std::strcmp(env, off) == 0, name, " must be ", off, " or ", on, ", not '", env, "'");
  return is_on;
}

int64_t env_int(const char* name, int64_t lo, int64_t hi, int64_t unset) {
  const char* env = std::getenv(name);
  if (env == nullptr) return unset;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(env, &end, 10);
  TILEINFER_CHECK(end != env && *end == '\0' && errno == 0 && v >= lo && v <= hi, name,
                  " must be an integer from ", lo, " to ", hi, ", not '", env, "'");
  return v;
}

}  // namespace tileinfer
