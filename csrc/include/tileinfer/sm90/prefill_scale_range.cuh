// Per-vector scales in the Hopper prefill: each key and value is turned into
// an fp16 operand already multiplied by its scale, so that the consumers run
// the loop of a cache with one scale per tensor (no scale per score column,
// none per probability column).
//
// That product is exact: a cache write stores scales of 4 (int8) or 7 (e4m3)
// significant bits (scale_rule.h), so stored value times scale has at most 11,
// an fp16 number once a power of two brings it into fp16's range. The power
// of two is one per (sequence, KV head) and kind (k, v), the same for every
// tile of the sequence, whichever item or path (converter warps, or the pass
// over the step's own keys: prefill_own_kv.cuh) makes the tile:
//
//   factor = 2^(kTopLog2 - e),   e = floor(log2 of the largest |scale|)
//
// puts the largest scaled factor in [16, 32) (int8: kTopLog2 4, so that the
// int8 conversion's 1152 f stays in range, quant.cuh) or [64, 128) (e4m3):
// the largest operand is below 4064 or 57344, and the products stay exact
// for scales down to 2^-25 (int8) or 2^-15 (e4m3, whose smallest step is
// 2^-9) of the largest; past that a tiny key or value is rounded to fp16's
// subnormal step.
// The consumers multiply scores by 1 / factor where they would by a
// per-tensor k_scale, and the output by 1 / factor of the values.
//
// prefill_scale_range finds the largest |scale| of every (sequence, KV
// head) of the step before the kernel: a block per pair (a grid from the
// shapes), over the positions the kernel may read (below the sequence's
// clamped length, from the page of the first key its first query sees under
// a window, on pages of the pool), into `top` ([num_seqs][num_kv_heads] of
// (k, v): the bits of non-negative floats, which order as the floats do).
// NaN scales are left out (their keys give NaN whatever the factor).
#pragma once

#include <climits>
#include <cstdint>

#include "../attention_work.cuh"
#include "../common.cuh"
#include "../paged_kv.cuh"
#include "../quant.cuh"
#include "prefill_tile.h"

namespace tileinfer {
namespace sm90 {

constexpr int kScaleRangeThreads = 1024;
static_assert(kScaleRangeThreads == 32 * 32, "one warp's lanes take the warps' maxima");

__global__ void __launch_bounds__(kScaleRangeThreads) prefill_scale_range(const AttentionParams p, uint2* top) {
  constexpr int kWarps = kScaleRangeThreads / 32;
  wait_for_prior_grids();  // the step's cache writes
  // The own-keys pass after this one loads its rows while this runs, and
  // waits for `top` (prefill_own_kv.cuh): allowed once this block's wait
  // has returned, as what that pass loads early is final by then.
  allow_dependent_launch();
  const PagedKVParams& kv = p.kv;
  const int s = blockIdx.x / kv.num_kv_heads;
  const int h = blockIdx.x - s * kv.num_kv_heads;
  const int seq_len = clamp_seq_len(kv, kv.seq_lens[s]);
  int begin = 0;
  if (p.window_left != INT_MAX) {
    const QueryRange qr = clamp_query_range(kv.cu_seqlens_q[s], kv.cu_seqlens_q[s + 1], p.num_tokens);
    begin = window_key_begin(p, seq_len, qr.count, 0);
  }
  const int page_shift = __ffs(kv.page_size) - 1;  // page sizes are powers of two (checked on the host)
  const int32_t* table = kv.block_tables + int64_t(s) * kv.max_pages;
  auto bits = [](float x) { return x == x ? __float_as_uint(fabsf(x)) : 0u; };
  uint32_t k = 0, v = 0;
#pragma unroll 4
  for (int pos = begin + static_cast<int>(threadIdx.x); pos < seq_len; pos += kScaleRangeThreads) {
    const int page = table[pos >> page_shift];
    if (page_in_pool(kv, page)) {
      const int64_t at = scale_offset(kv, page, h, pos & (kv.page_size - 1));
      k = max(k, bits(kv.k_scale[at]));
      v = max(v, bits(kv.v_scale[at]));
    }
  }
  __shared__ uint2 warps[kWarps];
  const int lane = threadIdx.x & 31;
  k = __reduce_max_sync(0xffffffffu, k);
  v = __reduce_max_sync(0xffffffffu, v);
  if (lane == 0) warps[threadIdx.x >> 5] = make_uint2(k, v);
  __syncthreads();
  if (threadIdx.x < 32) {
    const uint2 w = warps[lane];  // (kWarps == 32)
    k = __reduce_max_sync(0xffffffffu, w.x);
    v = __reduce_max_sync(0xffffffffu, w.y);
    if (lane == 0) top[blockIdx.x] = make_uint2(k, v);
  }
}

// log2 of the factor for a largest |scale| (`bits`: its float's bits):
// kTopLog2 - e, or 0 for a zero or inf largest scale (no finite operand to
// keep in range). e is floored at -120, so that the factor and its inverse
// are normal floats.
template <typename CacheT>
__device__ __forceinline__ int range_log2(uint32_t bits) {
  const int e = static_cast<int>(bits >> 23) - 127;
  return bits == 0 || e == 128 ? 0 : QuantFormat<CacheT>::kTopLog2 - max(e, -120);
}

// What the keys and values of sequence `seq`'s KV head `kv_head` are
// multiplied by into their fp16 operands (inverse: what its scores and
// output are multiplied by), from the pass's `top`.
struct ItemScales {
  float k;
  float v;
  template <typename CacheT>
  __device__ static ItemScales make(const uint2* top, int num_kv_heads, int seq, int kv_head, bool inverse) {
    const uint2 bits = top[int64_t(seq) * num_kv_heads + kv_head];
    auto pow2 = [&](uint32_t b) {
      const int x = range_log2<CacheT>(b);
      return __int_as_float((127 + (inverse ? -x : x)) << 23);
    };
    return {pow2(bits.x), pow2(bits.y)};
  }
  template <typename CacheT>
  __device__ static ItemScales make(const PrefillParams& p, const WorkItem& w, bool inverse) {
    return make<CacheT>(p.scale_top, p.a.kv.num_kv_heads, w.seq, w.kv_head, inverse);
  }
};

}  // namespace sm90
}  // namespace tileinfer
