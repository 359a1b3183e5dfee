// Host side shared by the prefill and decode launchers (prefill.cu, decode.cu):
// the checks that only the CUDA kernels need, AttentionParams from tensors, and
// the launch helpers (kept out of the dispatch macros, whose lambdas do not
// like the commas of template argument lists).
#pragma once

#include "tileinfer/error.h"
#include <atomic>
#include <climits>
#include <cstdint>
#include <optional>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include "checks.h"
#include "device_attribute.h"
#include "paged_params.h"
#include "tileinfer/attention_fp32.cuh"
#include "tileinfer/attention_kernel.cuh"
#include "tileinfer/params.h"

namespace tileinfer::cuda {

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// The kernels move whole 16-byte vectors of a token row: the row pointers must
// be 16-byte aligned, i.e. the data pointer and the token / head strides.
inline bool rows_aligned16(const at::Tensor& t) {
  const int64_t vec = 16 / t.element_size();
  return aligned16(t.data_ptr()) && t.stride(0) % vec == 0 && t.stride(1) % vec == 0;
}

// t where its rows are 16-byte aligned (rows_aligned16), else a contiguous
// copy of it in a fresh (aligned) allocation. Not t.contiguous(): that
// returns t itself when t is contiguous, however its start is aligned (a
// view one element into a buffer), and the kernels' 16-byte accesses then
// fault.
inline at::Tensor aligned_rows(const at::Tensor& t) {
  return rows_aligned16(t) ? t : t.clone(at::MemoryFormat::Contiguous);
}

// Cache and metadata checks that only the CUDA kernels need; fills the shared
// part of the params.
inline AttentionParams make_attention_params(const char* op, const PagedShape& s, const at::Tensor& q,
                                             const at::Tensor& k_cache, const at::Tensor& v_cache,
                                             const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                             const at::Tensor& cu_seqlens_q, int64_t max_q_len, double scale,
                                             bool causal, const std::optional<at::Tensor>& k_scale,
                                             const std::optional<at::Tensor>& v_scale,
                                             const std::optional<at::Tensor>& k_smooth, int64_t window_left,
                                             double logits_soft_cap, const std::optional<at::Tensor>& sinks) {
  TILEINFER_CHECK(q.is_cuda(), op, ": q must be a CUDA tensor, got ", q.device());
  // Pool rows (page, head, slot) are int32 in the kernels.
  TILEINFER_CHECK(s.num_pages * s.num_kv_heads * s.page_size < (int64_t(1) << 31), op,
              ": the pools hold too many rows (num_pages * num_kv_heads * page_size must be < 2^31)");
  TILEINFER_CHECK(aligned16(k_cache.data_ptr()) && aligned16(v_cache.data_ptr()), op,
              ": k_cache and v_cache must start at 16-byte aligned addresses");
  TILEINFER_CHECK(q.size(0) < (int64_t(1) << 31) && max_q_len < (int64_t(1) << 31), op,
              ": too many tokens for int32 token indices");

  AttentionParams p{};
  p.kv = paged_params(s, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_scale, v_scale, k_smooth);
  p.q = q.data_ptr();
  p.q_stride_token = q.stride(0);
  p.q_stride_head = q.stride(1);
  p.num_tokens = static_cast<int>(q.size(0));
  p.num_q_heads = static_cast<int>(q.size(1));
  p.group_size = static_cast<int>(q.size(1) / s.num_kv_heads);
  p.max_q_len = static_cast<int>(max_q_len);
  p.num_splits = 1;
  p.scale = static_cast<float>(scale);
  p.causal = causal;
  // No window (-1), or one that reaches past every position the block table
  // holds (the same thing), is INT_MAX for the kernels (window_first_key).
  const int64_t cap = s.max_pages * s.page_size;
  p.window_left = window_left < 0 || window_left >= cap ? INT_MAX : static_cast<int>(window_left);
  p.soft_cap = static_cast<float>(logits_soft_cap);
  p.sinks = sinks.has_value() ? sinks->data_ptr<float>() : nullptr;
  return p;
}

// Above 48 KB a kernel must opt in to its dynamic shared memory, once per
// device (a driver call per launch costs microseconds of host time at decode).
// One instance per kernel: a static inside launch_attention, instantiated per
// kernel (all kernels share one function-pointer type, so a static keyed on
// that type would let one kernel's opt-in stand for another's).
class SmemOptIn {
 public:
  template <typename Kernel>
  void ensure(Kernel kernel, int bytes) {
    const int dev = c10::cuda::current_device();
    const uint64_t bit = dev < 64 ? (uint64_t(1) << dev) : 0;
    if (bit != 0 && (done_.load(std::memory_order_acquire) & bit)) return;
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    done_.fetch_or(bit, std::memory_order_release);
  }

 private:
  std::atomic<uint64_t> done_{0};  // one bit per device
};

inline void check_grid(const char* op, const dim3& grid) {
  TILEINFER_CHECK(grid.y <= 65535 && grid.z <= 65535, op, ": launch grid (", grid.x, ", ", grid.y, ", ", grid.z,
              ") exceeds CUDA's limits (too many sequences, heads or query tiles)");
}

// Launches one attention kernel (a tile or fp32 kernel instantiation) with its
// work mapping's grid. `kKernel` as a template argument gives each kernel its
// own static opt-in.
template <auto kKernel, class Cfg, class Work>
void launch_attention(const char* op, AttentionParams p, cudaStream_t stream) {
  const dim3 grid = Work::template grid<Cfg::kBlockM>(p);
  check_grid(op, grid);
  // A walking decode launch without partials: the running merge of a block's
  // splits too (tile_config.cuh). Only there: the bytes would cost the
  // partials' launches of the int8 tile their third block per SM.
  constexpr int kMergeBytes = [] {
    if constexpr (Work::kWalks) {
      return Cfg::kSplitMergeBytes;
    } else {
      return 0;
    }
  }();
  static SmemOptIn opt_in;
  opt_in.ensure(kKernel, Cfg::kSmemBytes + kMergeBytes);
  const int smem = Cfg::kSmemBytes + (p.partial_out == nullptr ? kMergeBytes : 0);
  p.programmatic = programmatic_launch(c10::cuda::current_device());
  // Decode splits merged in clusters (cluster_merge.cuh): a cluster of the
  // splits of each (sequence, KV head, row tile).
  const unsigned cluster = p.cluster_splits > 1 ? static_cast<unsigned>(p.cluster_splits) : 1u;
  TILEINFER_CHECK(cluster == 1 || grid.x == cluster, op, ": a cluster holds every split of its rows");
  C10_CUDA_CHECK(launch_kernel_ex(0, cluster, kKernel, grid, dim3(Cfg::kThreads), smem, stream, p.programmatic, p));
}

template <class Cfg, class Work>
void launch_tile(const char* op, const AttentionParams& p, cudaStream_t stream) {
  launch_attention<attention_tile_kernel<Cfg, Work>, Cfg, Work>(op, p, stream);
}

template <int kHeadDim, class Work>
void launch_fp32(const char* op, const AttentionParams& p, cudaStream_t stream) {
  launch_attention<attention_fp32_kernel<kHeadDim, Work>, Fp32Config<kHeadDim>, Work>(op, p, stream);
}

}  // namespace tileinfer::cuda
