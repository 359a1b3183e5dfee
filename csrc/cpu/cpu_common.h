// Small helpers shared by the CPU implementations (csrc/cpu/*.cpp): element
// conversions, the host view of a paged cache, and the element-type switch.
// Plain C++ over data pointers; accuracy first, speed second (the CPU ops are
// the reference the GPU kernels are tested against).
#pragma once

#include "tileinfer/error.h"
#include <cstdint>

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "checks.h"
#include "tileinfer/tile_table.h"

namespace tileinfer::cpu::detail {

// Round-to-nearest-even conversions, as PyTorch's casts.
template <typename T> inline float to_float(T x) { return static_cast<float>(x); }
template <typename T> inline T from_float(float x) { return static_cast<T>(x); }

// Element types of q / out / a non-int8 cache (tileinfer/tile_table.h:
// kFloatDtypes). The lambda sees `scalar_t`.
#define TILEINFER_CPU_DISPATCH_FLOAT(stype, NAME, ...)                                       \
  [&] {                                                                                     \
    switch (stype) {                                                                        \
      case at::kBFloat16: { using scalar_t = c10::BFloat16; return __VA_ARGS__(); }         \
      case at::kHalf: { using scalar_t = c10::Half; return __VA_ARGS__(); }                 \
      case at::kFloat: { using scalar_t = float; return __VA_ARGS__(); }                    \
      default:                                                                              \
        TILEINFER_CHECK(false, NAME, ": unsupported dtype ", stype, " (expected ",           \
                        ::tileinfer::expected(::tileinfer::kFloatDtypes), ")");             \
    }                                                                                       \
  }()

// The paged cache and the step's metadata, all on the host.
struct HostKV {
  const void* k_cache;          // [num_pages, num_kv_heads, page_size, head_dim]
  const void* v_cache;
  const float* k_scale;         // [num_pages, num_kv_heads, page_size], or [1] per tensor (quantized only)
  const float* v_scale;
  const float* k_smooth;        // [num_kv_heads, head_dim] (quantized only, may be null)
  const int32_t* block_tables;  // [num_seqs, max_pages]
  const int32_t* seq_lens;      // [num_seqs]
  const int32_t* cu_seqlens_q;  // [num_seqs + 1]
  PagedShape s;

  // Offset of (page, kv_head, slot) in a pool, in vectors of head_dim.
  int64_t vec(int64_t page, int64_t kv_head, int64_t slot) const {
    return (page * s.num_kv_heads + kv_head) * s.page_size + slot;
  }
  // Index of the scale of the vector at offset `at` (vec()): 0 for per-tensor scales.
  int64_t scale_index(int64_t at) const { return s.scale_per_tensor ? 0 : at; }
  // Page id of the j-th page of a sequence, or -1 when it lies outside the pool:
  // such pages are skipped, as on the GPU.
  int64_t page_of(int64_t seq, int64_t j) const {
    const int64_t page = block_tables[seq * s.max_pages + j];
    return (page >= 0 && page < s.num_pages) ? page : -1;
  }
};

inline HostKV host_kv(const PagedShape& s, const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const at::Tensor& block_tables, const at::Tensor& seq_lens,
                      const at::Tensor& cu_seqlens_q, const std::optional<at::Tensor>& k_scale,
                      const std::optional<at::Tensor>& v_scale,
                      const std::optional<at::Tensor>& k_smooth) {
  HostKV kv;
  kv.k_cache = k_cache.data_ptr();
  kv.v_cache = v_cache.data_ptr();
  kv.k_scale = s.quantized ? k_scale->data_ptr<float>() : nullptr;
  kv.v_scale = s.quantized ? v_scale->data_ptr<float>() : nullptr;
  kv.k_smooth = (s.quantized && k_smooth.has_value()) ? k_smooth->data_ptr<float>() : nullptr;
  kv.block_tables = block_tables.data_ptr<int32_t>();
  kv.seq_lens = seq_lens.data_ptr<int32_t>();
  kv.cu_seqlens_q = cu_seqlens_q.data_ptr<int32_t>();
  kv.s = s;
  return kv;
}

}  // namespace tileinfer::cpu::detail
