// The CUDA `combine` op: merges partial results (decode splits, or prefill
// outputs with lse over disjoint page ranges) into out and, optionally, lse.
// The kernel is in csrc/include/tileinfer/combine.cuh.
#include <cstdint>
#include <limits>
#include <optional>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "checks.h"
#include "device_attribute.h"
#include "ops.h"
#include "tileinfer/combine.cuh"
#include "tileinfer/dispatch.h"

namespace tileinfer::cuda {
namespace {

// The shared checks (checks.cpp) plus what the kernel needs: a CUDA tensor,
// 16-byte aligned partials (16-byte loads), int32 row and split counts.
void check_combine_inputs(const char* op, const at::Tensor& out, const std::optional<at::Tensor>& lse,
                          const at::Tensor& partial_out, const at::Tensor& partial_lse) {
  TILEINFER_CHECK(partial_out.is_cuda(), op, ": partial_out must be a CUDA tensor, got ", partial_out.device());
  check_combine(op, out, lse, partial_out, partial_lse);
  TILEINFER_CHECK(reinterpret_cast<uintptr_t>(partial_out.data_ptr()) % 16 == 0, op,
              ": partial_out must be 16-byte aligned");
  const int64_t splits = partial_out.size(0), tokens = partial_out.size(1), heads = partial_out.size(2);
  TILEINFER_CHECK(tokens * heads <= std::numeric_limits<int32_t>::max() && splits <= std::numeric_limits<int32_t>::max(),
              op, ": partial_out is too large (num_tokens * num_q_heads and num_splits must fit in int32)");
}

// Launches combine_kernel for p on the current stream (device: the current one,
// set by the caller's guard).
void launch_combine_for(const char* op, const at::Tensor& out, const AttentionParams& p) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool programmatic = programmatic_launch(out.get_device());
  TILEINFER_DISPATCH_FLOAT(out.scalar_type(), op, [&] {
    TILEINFER_DISPATCH_TILE_DIM(p.kv.head_dim, op, [&] {
      const cudaError_t err = launch_combine<scalar_t, TILE_DIM>(p, stream, programmatic);  // (commas: not in the macro)
      C10_CUDA_CHECK(err);
    });
  });
}

}  // namespace

// out [num_tokens, num_q_heads, head_dim] bf16/fp16/fp32 (token/head strides free);
// lse [num_tokens, num_q_heads] fp32 or None;
// partial_out [num_splits, num_tokens, num_q_heads, head_dim] fp32;
// partial_lse [num_splits, num_tokens, num_q_heads] fp32.
// lse_gated: partials of lse -inf may hold no out (a batch-invariant decode
// plan's empty splits; combine.cuh, kLseGated).
void combine_as(const char* op, at::Tensor& out, const std::optional<at::Tensor>& lse,
                const at::Tensor& partial_out, const at::Tensor& partial_lse, bool lse_gated) {
  check_combine_inputs(op, out, lse, partial_out, partial_lse);
  const c10::cuda::CUDAGuard guard(partial_out.device());

  AttentionParams p{};  // the paged-cache fields stay zero: combine does not read the cache
  p.out = out.data_ptr();
  p.o_stride_token = out.stride(0);
  p.o_stride_head = out.stride(1);
  p.lse = lse.has_value() ? lse->data_ptr<float>() : nullptr;
  p.partial_out = const_cast<float*>(partial_out.const_data_ptr<float>());
  p.partial_lse = const_cast<float*>(partial_lse.const_data_ptr<float>());
  p.num_splits = static_cast<int>(partial_out.size(0));
  p.num_tokens = static_cast<int>(partial_out.size(1));
  p.num_q_heads = static_cast<int>(partial_out.size(2));
  p.kv.head_dim = static_cast<int>(partial_out.size(3));
  p.split_slots = lse_gated ? p.num_splits : 0;

  launch_combine_for(op, out, p);
}

void combine_slots(at::Tensor& out, const at::Tensor& partial_out, const at::Tensor& partial_lse,
                   const at::Tensor& cu_seqlens_q, int64_t num_tokens, int64_t mixed_queries, bool lse_gated) {
  const c10::cuda::CUDAGuard guard(partial_out.device());
  AttentionParams p{};
  p.out = out.data_ptr();
  p.o_stride_token = out.stride(0);
  p.o_stride_head = out.stride(1);
  p.partial_out = const_cast<float*>(partial_out.const_data_ptr<float>());
  p.partial_lse = const_cast<float*>(partial_lse.const_data_ptr<float>());
  p.num_splits = static_cast<int>(partial_out.size(0));
  p.num_tokens = static_cast<int>(num_tokens);
  p.num_q_heads = static_cast<int>(partial_out.size(2));
  p.kv.head_dim = static_cast<int>(partial_out.size(3));
  p.kv.cu_seqlens_q = cu_seqlens_q.const_data_ptr<int32_t>();
  p.kv.num_seqs = static_cast<int>(cu_seqlens_q.size(0) - 1);
  p.mixed_queries = static_cast<int>(mixed_queries);
  p.split_slots = lse_gated ? p.num_splits : 0;
  launch_combine_for("attention", out, p);
}

void combine(at::Tensor& out, const std::optional<at::Tensor>& lse, const at::Tensor& partial_out,
             const at::Tensor& partial_lse) {
  combine_as("combine", out, lse, partial_out, partial_lse, false);
}

}  // namespace tileinfer::cuda

TORCH_LIBRARY_IMPL(tileinfer_attn, CUDA, m) { m.impl("combine", &tileinfer::cuda::combine); }
