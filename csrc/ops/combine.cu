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
#include "ops.h"
#include "tileinfer/combine.cuh"
#include "tileinfer/dispatch.h"

namespace tileinfer::cuda {
namespace {

constexpr const char* kOp = "combine";

// Checks shapes, dtypes and devices of the four arguments against partial_out,
// which fixes [num_splits, num_tokens, num_q_heads, head_dim].
void check_combine_inputs(const at::Tensor& out, const std::optional<at::Tensor>& lse,
                          const at::Tensor& partial_out, const at::Tensor& partial_lse) {
  TILEINFER_CHECK(partial_out.is_cuda(), kOp, ": partial_out must be a CUDA tensor, got ", partial_out.device());
  TILEINFER_CHECK(partial_out.dim() == 4, kOp,
              ": partial_out must be 4-D [num_splits, num_tokens, num_q_heads, head_dim], got shape ",
              partial_out.sizes());
  TILEINFER_CHECK(partial_out.scalar_type() == at::kFloat, kOp, ": partial_out must be float32, got ",
              partial_out.scalar_type());
  TILEINFER_CHECK(partial_out.is_contiguous(), kOp, ": partial_out must be contiguous");
  // The kernel reads partials with 16-byte loads.
  TILEINFER_CHECK(reinterpret_cast<uintptr_t>(partial_out.data_ptr()) % 16 == 0, kOp,
              ": partial_out must be 16-byte aligned");
  const at::Device device = partial_out.device();
  const int64_t splits = partial_out.size(0), tokens = partial_out.size(1), heads = partial_out.size(2),
                head_dim = partial_out.size(3);
  TILEINFER_CHECK(splits >= 1, kOp, ": partial_out must hold at least one split (dim 0), got ", splits);
  TILEINFER_CHECK(head_dim == 64 || head_dim == 128 || head_dim == 256, kOp, ": unsupported head_dim ", head_dim,
              " (dim 3 of partial_out; expected 64, 128 or 256)");
  TILEINFER_CHECK(tokens * heads <= std::numeric_limits<int32_t>::max() && splits <= std::numeric_limits<int32_t>::max(),
              kOp, ": partial_out is too large (num_tokens * num_q_heads and num_splits must fit in int32)");

  TILEINFER_CHECK(partial_lse.device() == device, kOp, ": partial_lse must be on ", device,
              " (the device of partial_out), got ", partial_lse.device());
  TILEINFER_CHECK(partial_lse.scalar_type() == at::kFloat, kOp, ": partial_lse must be float32, got ",
              partial_lse.scalar_type());
  TILEINFER_CHECK(partial_lse.dim() == 3 && partial_lse.size(0) == splits && partial_lse.size(1) == tokens &&
                  partial_lse.size(2) == heads,
              kOp, ": partial_lse must have shape [", splits, ", ", tokens, ", ", heads,
              "] (num_splits, num_tokens, num_q_heads of partial_out), got ", partial_lse.sizes());
  TILEINFER_CHECK(partial_lse.is_contiguous(), kOp, ": partial_lse must be contiguous");

  TILEINFER_CHECK(out.device() == device, kOp, ": out must be on ", device, " (the device of partial_out), got ",
              out.device());
  const at::ScalarType dt = out.scalar_type();
  TILEINFER_CHECK(dt == at::kBFloat16 || dt == at::kHalf || dt == at::kFloat, kOp,
              ": out must be bfloat16, float16 or float32, got ", dt);
  check_token_tensor(kOp, "out", out, tokens, heads, head_dim, dt, device);

  if (lse.has_value()) {
    TILEINFER_CHECK(lse->device() == device, kOp, ": lse must be on ", device, " (the device of partial_out), got ",
                lse->device());
    TILEINFER_CHECK(lse->scalar_type() == at::kFloat, kOp, ": lse must be float32, got ", lse->scalar_type());
    TILEINFER_CHECK(lse->dim() == 2 && lse->size(0) == tokens && lse->size(1) == heads, kOp,
                ": lse must have shape [", tokens, ", ", heads, "] (num_tokens, num_q_heads), got ",
                lse->sizes());
    TILEINFER_CHECK(lse->is_contiguous(), kOp, ": lse must be contiguous");
  }
}

}  // namespace

// out [num_tokens, num_q_heads, head_dim] bf16/fp16/fp32 (token/head strides free);
// lse [num_tokens, num_q_heads] fp32 or None;
// partial_out [num_splits, num_tokens, num_q_heads, head_dim] fp32;
// partial_lse [num_splits, num_tokens, num_q_heads] fp32.
void combine(at::Tensor& out, const std::optional<at::Tensor>& lse, const at::Tensor& partial_out,
             const at::Tensor& partial_lse) {
  check_combine_inputs(out, lse, partial_out, partial_lse);
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

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TILEINFER_DISPATCH_FLOAT(out.scalar_type(), kOp, [&] {
    TILEINFER_DISPATCH_HEAD_DIM(p.kv.head_dim, kOp, [&] {
      launch_combine<scalar_t, HEAD_DIM>(p, stream);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

}  // namespace tileinfer::cuda

TORCH_LIBRARY_IMPL(tileinfer_attn, CUDA, m) { m.impl("combine", &tileinfer::cuda::combine); }
