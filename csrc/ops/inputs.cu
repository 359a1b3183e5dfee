// CUDA rms_norm, rope, cache_write (plain and quantizing: int8, fp8) and the fused
// attention_inputs: argument checks, dispatch, launches. The kernels and the
// per-row stages they share are in include/tileinfer/inputs.cuh; the fused op
// runs the same stages as the separate ops, hence the same bits.
//
// attention_inputs is two launches: the queries (norm, rotation, q_out), then
// the keys and values (norm and rotation of the key, both into their page).
// Each head is read once, positions come from the device metadata, and the
// grids depend on shapes only, so a captured CUDA graph stays valid as
// sequences grow.
#include <cstdint>
#include <type_traits>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "checks.h"
#include "device_attribute.h"
#include "ops.h"
#include "paged_params.h"
#include "tileinfer/dispatch.h"
#include "tileinfer/inputs.cuh"

namespace tileinfer::cuda {
namespace {

// ---------------------------------------------------------------------------
// Checks. Messages match the CPU implementation's (csrc/cpu/inputs.cpp).

// The kernels move rows in 16-byte vectors: the data pointer and the token and
// head strides of a token tensor must be multiples of 16 bytes. Views of a
// packed qkv tensor with head_dim 64/128/256 always are.
void check_vector_aligned(const char* op, const char* name, const at::Tensor& t) {
  const int64_t elem = t.element_size();
  const bool ok = reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && (t.stride(0) * elem) % 16 == 0 &&
                  (t.stride(1) * elem) % 16 == 0;
  TILEINFER_CHECK(ok, op, ": ", name,
              " must be 16-byte aligned (data pointer, token and head strides multiples of 16 bytes) for "
              "vector loads, got strides ",
              t.strides(), " of ", t.scalar_type());
}

// A norm weight (checked as on every device) 16-byte aligned for the vector loads.
void check_weight_alignment(const char* op, const char* name, const at::Tensor& w) {
  TILEINFER_CHECK(reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 == 0, op, ": ", name,
                  " must be 16-byte aligned (vector loads)");
}

// k, v (checked as on every device) 16-byte aligned, row count within int32.
void check_kv_aligned(const char* op, const PagedShape& s, const at::Tensor& k, const at::Tensor& v) {
  check_vector_aligned(op, "k", k);
  check_vector_aligned(op, "v", v);
  TILEINFER_CHECK(k.size(0) < (int64_t(1) << 31) / s.num_kv_heads, op, ": too many tokens (", k.size(0), ")");
}

// ---------------------------------------------------------------------------
// Parameter filling.

// The float4 path of the rotation needs rotary_dim / 2 to be a multiple of the
// element vector and 16-byte aligned table rows.
// positions: attention_inputs' explicit rotary positions (checked), if any.
RopeTable rope_table(const at::Tensor& cos_sin_cache, int64_t rotary_dim, int64_t vec,
                     const std::optional<at::Tensor>& positions = std::nullopt) {
  RopeTable t{};
  t.cos_sin = cos_sin_cache.data_ptr<float>();
  t.stride = cos_sin_cache.stride(0);
  t.max_position = cos_sin_cache.size(0);
  t.rotary_dim = static_cast<int>(rotary_dim);
  t.vec_ok = (rotary_dim / 2) % vec == 0 && reinterpret_cast<uintptr_t>(t.cos_sin) % 16 == 0 &&
             (t.stride * 4) % 16 == 0;
  t.positions = positions.has_value() ? positions->data_ptr() : nullptr;
  t.positions64 = positions.has_value() && positions->scalar_type() == at::kLong;
  return t;
}

void set_rows_io(RowsParams& p, const at::Tensor& x, const at::Tensor& out) {
  p.x = x.data_ptr();
  p.x_stride_token = x.stride(0);
  p.x_stride_head = x.stride(1);
  p.out = out.data_ptr();
  p.out_stride_token = out.stride(0);
  p.out_stride_head = out.stride(1);
  p.num_tokens = static_cast<int>(x.size(0));
  p.num_heads = static_cast<int>(x.size(1));
}

// The keys-and-values kernel's params: kv (the pools' read-only view, shared
// with the attention kernels) plus the writable pool and scale pointers, and
// the k / v rows.
KVWriteParams kv_write_params(const PagedKVParams& kv, at::Tensor& k_cache, at::Tensor& v_cache,
                              const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                              const at::Tensor& k, const at::Tensor& v) {
  KVWriteParams p{};
  p.kv = kv;
  p.k_pool = k_cache.data_ptr();
  p.v_pool = v_cache.data_ptr();
  p.k_scale = kv.k_scale != nullptr ? k_scale->data_ptr<float>() : nullptr;  // quantized pools only
  p.v_scale = kv.v_scale != nullptr ? v_scale->data_ptr<float>() : nullptr;
  p.k_smooth = kv.k_smooth;
  p.k = k.data_ptr();
  p.k_stride_token = k.stride(0);
  p.k_stride_head = k.stride(1);
  p.v = v.data_ptr();
  p.v_stride_token = v.stride(0);
  p.v_stride_head = v.stride(1);
  p.num_tokens = static_cast<int>(k.size(0));
  return p;
}

// ---------------------------------------------------------------------------
// Launchers: template argument commas stay out of the dispatch macros.

template <typename T, int D, bool NORM, PosFrom POS>
void launch_rows(const RowsParams& params, cudaStream_t stream) {
  using L = RowLayout<T, D>;
  const int64_t rows = static_cast<int64_t>(params.num_tokens) * params.num_heads;
  if (rows == 0) return;
  const int device = c10::cuda::current_device();
  const int sms = cached_device_attribute<cudaDevAttrMultiProcessorCount>(device);
  RowsParams p = params;
  // Without a rotation a group has no position or cos / sin to share: one row.
  p.rows_per_group = POS == PosFrom::kNone ? 1 : rows_per_group_for(rows, L::kGroups, sms);
  const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(rows, int64_t(L::kGroups) * p.rows_per_group)));
  C10_CUDA_CHECK(launch_kernel(rows_kernel<T, D, NORM, POS>, grid, dim3(kInputsThreads), 0, stream,
                               programmatic_launch(device), p));
}

template <typename T, int D, bool NORM, bool ROPE, typename CacheT>
void launch_kv_write(const KVWriteParams& p, cudaStream_t stream) {
  using L = RowLayout<T, D>;
  const int64_t rows = static_cast<int64_t>(p.num_tokens) * p.kv.num_kv_heads;
  if (rows == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(rows, L::kGroups)));
  C10_CUDA_CHECK(launch_kernel(kv_write_kernel<T, D, NORM, ROPE, CacheT>, grid, dim3(kInputsThreads), 0, stream,
                               programmatic_launch(c10::cuda::current_device()), p));
}

// The keys / values kernel of cache_write (ROPE false) and attention_inputs.
// A quantized pool takes bf16 / fp16 rows (checked by the ops): a function
// template, so that `if constexpr` keeps fp32 rows with a quantized pool from
// being instantiated (in the dispatch macros' plain lambdas it would not).
template <typename T, int D, bool KNORM, bool ROPE>
void launch_kv(const KVWriteParams& p, const PagedShape& s, const char* op, cudaStream_t stream) {
  if constexpr (!std::is_same_v<T, float>) {
    if (s.quantized)
      return TILEINFER_DISPATCH_QUANT(s.cache_dtype, op, [&] { launch_kv_write<T, D, KNORM, ROPE, cache_t>(p, stream); });
  }
  launch_kv_write<T, D, KNORM, ROPE, T>(p, stream);
}

// The shapes of a token tensor op (rms_norm, rope) on x and out.
void check_rows_op(const char* op, const at::Tensor& out, const at::Tensor& x) {
  check_rows_io(op, out, x);
  TILEINFER_CHECK(x.is_cuda(), op, ": x must be a CUDA tensor, got ", x.device());
  check_vector_aligned(op, "x", x);
  check_vector_aligned(op, "out", out);
  TILEINFER_CHECK(x.size(0) * x.size(1) < (int64_t(1) << 31), op, ": too many rows (num_tokens * num_heads = ",
              x.size(0) * x.size(1), ")");
}

}  // namespace

// out, x [num_tokens, num_heads, head_dim]; weight [head_dim].
void rms_norm(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps) {
  const char* op = "rms_norm";
  check_rows_op(op, out, x);
  check_weight(op, "weight", weight, x.size(2), x.scalar_type(), x.device());
  check_weight_alignment(op, "weight", weight);
  const c10::cuda::CUDAGuard guard(x.device());
  RowsParams p{};
  set_rows_io(p, x, out);
  p.weight = weight.data_ptr();
  p.eps = static_cast<float>(eps);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TILEINFER_DISPATCH_FLOAT(x.scalar_type(), op, [&] {
    TILEINFER_DISPATCH_HEAD_DIM(x.size(2), op, [&] {
      launch_rows<scalar_t, HEAD_DIM, true, PosFrom::kNone>(p, stream);
    });
  });
}

// out, x [num_tokens, num_heads, head_dim]; positions [num_tokens] int32/int64;
// cos_sin_cache [max_position, rotary_dim] fp32. Tokens whose position lies
// outside [0, max_position) are skipped: their out rows are not written.
void rope(at::Tensor& out, const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_sin_cache,
          int64_t rotary_dim) {
  const char* op = "rope";
  check_rows_op(op, out, x);
  check_positions(op, positions, x);
  TILEINFER_CHECK(positions.is_contiguous(), op, ": positions must be contiguous");
  check_rotary(op, cos_sin_cache, rotary_dim, x.size(2), x.device());
  const c10::cuda::CUDAGuard guard(x.device());
  RowsParams p{};
  set_rows_io(p, x, out);
  p.positions = positions.data_ptr();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TILEINFER_DISPATCH_FLOAT(x.scalar_type(), op, [&] {
    p.rope = rope_table(cos_sin_cache, rotary_dim, 16 / sizeof(scalar_t));
    TILEINFER_DISPATCH_HEAD_DIM(x.size(2), op, [&] {
      TILEINFER_BOOL_SWITCH(positions.scalar_type() == at::kLong, POS64, [&] {
        launch_rows<scalar_t, HEAD_DIM, false, POS64 ? PosFrom::kInt64 : PosFrom::kInt32>(p, stream);
      });
    });
  });
}

// k_cache, v_cache [num_pages, num_kv_heads, page_size, head_dim]; k, v
// [num_tokens, num_kv_heads, head_dim]; a quantized pool: k_scale / v_scale
// [num_pages, num_kv_heads, page_size] (or [1], fp8), k_smooth [num_kv_heads, head_dim].
void cache_write(at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& k, const at::Tensor& v,
                 const at::Tensor& block_tables, const at::Tensor& seq_lens, const at::Tensor& cu_seqlens_q,
                 const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                 const std::optional<at::Tensor>& k_smooth) {
  const char* op = "cache_write";
  const PagedShape s =
      check_paged_cache(op, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_scale, v_scale, k_smooth);
  TILEINFER_CHECK(k_cache.is_cuda(), op, ": k_cache must be a CUDA tensor, got ", k_cache.device());
  const at::ScalarType dtype = check_kv_inputs(op, s, k, v, k_cache);
  check_kv_aligned(op, s, k, v);
  const c10::cuda::CUDAGuard guard(k_cache.device());
  const KVWriteParams p = kv_write_params(
      paged_params(s, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_scale, v_scale, k_smooth), k_cache,
      v_cache, k_scale, v_scale, k, v);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TILEINFER_DISPATCH_FLOAT(dtype, op, [&] {
    TILEINFER_DISPATCH_HEAD_DIM(s.head_dim, op, [&] { launch_kv<scalar_t, HEAD_DIM, false, false>(p, s, op, stream); });
  });
}

// q, q_out [num_tokens, num_q_heads, head_dim]; k, v [num_tokens, num_kv_heads,
// head_dim] (q, k, v may be views of one packed qkv tensor); pools and
// metadata as cache_write; cos_sin_cache [max_position, rotary_dim] fp32;
// q_norm_weight / k_norm_weight [head_dim] or None.
// positions [num_tokens] int32/int64 or None: the rotary positions (else the
// slot positions); the cache slots stay those of the metadata.
// A token of no sequence, or whose rotary position lies outside [0, max_position),
// is skipped entirely: neither its q_out rows nor its cache slots are written.
// A token whose slot is not in the cache (position past the block table, page
// id outside the pool) still gets its q_out rows; its keys are not written.
void attention_inputs(at::Tensor& q_out, at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& q,
                      const at::Tensor& k, const at::Tensor& v, const at::Tensor& block_tables,
                      const at::Tensor& seq_lens, const at::Tensor& cu_seqlens_q, const at::Tensor& cos_sin_cache,
                      int64_t rotary_dim, const std::optional<at::Tensor>& q_norm_weight,
                      const std::optional<at::Tensor>& k_norm_weight, double eps,
                      const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                      const std::optional<at::Tensor>& k_smooth, const std::optional<at::Tensor>& positions) {
  const char* op = "attention_inputs";
  const InputsShape in = check_attention_inputs(op, q_out, k_cache, v_cache, q, k, v, block_tables, seq_lens,
                                                cu_seqlens_q, cos_sin_cache, rotary_dim, q_norm_weight,
                                                k_norm_weight, k_scale, v_scale, k_smooth, positions);
  const PagedShape& s = in.cache;
  const at::ScalarType dtype = in.dtype;
  const int64_t d = s.head_dim;
  // What the kernels add: CUDA tensors, 16-byte vectors, int32 row counts.
  TILEINFER_CHECK(k_cache.is_cuda(), op, ": k_cache must be a CUDA tensor, got ", k_cache.device());
  check_kv_aligned(op, s, k, v);
  check_vector_aligned(op, "q", q);
  check_vector_aligned(op, "q_out", q_out);
  TILEINFER_CHECK(q.size(0) * q.size(1) < (int64_t(1) << 31), op, ": too many query rows");
  if (q_norm_weight.has_value()) check_weight_alignment(op, "q_norm_weight", *q_norm_weight);
  if (k_norm_weight.has_value()) check_weight_alignment(op, "k_norm_weight", *k_norm_weight);
  const c10::cuda::CUDAGuard guard(k_cache.device());
  const PagedKVParams kv =
      paged_params(s, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_scale, v_scale, k_smooth);

  RowsParams qp{};
  set_rows_io(qp, q, q_out);
  qp.weight = q_norm_weight.has_value() ? q_norm_weight->data_ptr() : nullptr;
  qp.eps = static_cast<float>(eps);
  qp.kv = kv;

  KVWriteParams kp = kv_write_params(kv, k_cache, v_cache, k_scale, v_scale, k, v);
  kp.k_weight = k_norm_weight.has_value() ? k_norm_weight->data_ptr() : nullptr;
  kp.eps = static_cast<float>(eps);
  kp.after_queries = q.size(0) * q.size(1) > 0;  // the queries kernel below runs (else the keys / values wait as usual)

  // The queries, then the keys and values. (The table's float4 path depends
  // on the element width.)
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TILEINFER_DISPATCH_FLOAT(dtype, op, [&] {
    qp.rope = kp.rope = rope_table(cos_sin_cache, rotary_dim, 16 / sizeof(scalar_t), positions);
    TILEINFER_DISPATCH_HEAD_DIM(d, op, [&] {
      TILEINFER_BOOL_SWITCH(q_norm_weight.has_value(), QNORM, [&] {
        launch_rows<scalar_t, HEAD_DIM, QNORM, PosFrom::kMetadata>(qp, stream);
      });
      TILEINFER_BOOL_SWITCH(k_norm_weight.has_value(), KNORM, [&] {
        launch_kv<scalar_t, HEAD_DIM, KNORM, true>(kp, s, op, stream);
      });
    });
  });
}

}  // namespace tileinfer::cuda

TORCH_LIBRARY_IMPL(tileinfer_attn, CUDA, m) {
  m.impl("rms_norm", &tileinfer::cuda::rms_norm);
  m.impl("rope", &tileinfer::cuda::rope);
  m.impl("cache_write", &tileinfer::cuda::cache_write);
  m.impl("attention_inputs", &tileinfer::cuda::attention_inputs);
}
