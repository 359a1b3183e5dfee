// A quantized cache's prefill: the step's own keys and values (those at its
// queries' positions, which the step has just written) turned into fp16
// once, before the warp-specialized kernel, as rows [num_tokens]
// [num_kv_heads][head_dim]: exactly the converter warps' values (quant.cuh:
// every int8 and e4m3 value is an fp16 number; per-vector scales: times its
// scale over the sequence's power of two, prefill_scale_range.cuh, as the
// converters multiply). The kernel's producer copies a key or value tile whose
// positions are all the step's own from there, as over a 16-bit cache,
// straight into the stage, and the converter warps only zero its rows past
// the key end (prefill_producer.cuh, prefill_convert.cuh). So a fresh
// prompt's tiles skip the converters' work beside the consumers (their
// stores of the operand tiles cost the key loop most: docs/PERFORMANCE.md),
// for one pass over the step's tokens; a chunk after a cached prefix takes
// the prefix's tiles through the converters as before.
//
// Token t belongs to the sequence whose query range holds it, under the
// clamps the work items take (clamp_query_range, clamp_seq_len), at position
// seq_len - q_count + (t - q_begin). That is one to one only where the query
// ranges follow each other (cu_seqlens_q non-decreasing): block 0 checks it
// and writes `ok`, and the producer copies own tiles only where it is set, so
// malformed metadata takes the converters' path (the bits are the same on
// both paths wherever the mapping holds). Rows of tokens outside every
// range, of sequences that a mixed step leaves to decode, at positions before
// 0 or on pages outside the pool are zeros (no work item reads them as keys).
#pragma once

#include "../attention_work.cuh"
#include "../common.cuh"
#include "../params.h"
#include "../quant.cuh"
#include "prefill_scale_range.cuh"

namespace tileinfer {
namespace sm90 {

constexpr int kOwnKvThreads = 256;

// The sequence whose clamped query range holds token t, or -1.
__device__ __forceinline__ int own_token_seq(const AttentionParams& p, int t) {
  const PagedKVParams& kv = p.kv;
  auto begin = [&](int s) { return clamp_query_range(kv.cu_seqlens_q[s], kv.cu_seqlens_q[s], p.num_tokens).begin; };
  int lo = 0, hi = kv.num_seqs - 1;  // the last s with begin(s) <= t, if any
  if (hi < 0 || begin(0) > t) return -1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (begin(mid) <= t) lo = mid;
    else hi = mid - 1;
  }
  const QueryRange qr = clamp_query_range(kv.cu_seqlens_q[lo], kv.cu_seqlens_q[lo + 1], p.num_tokens);
  return t < qr.begin + qr.count ? lo : -1;
}

// One thread per 8 values of a (token, KV head) row, keys and values.
// kVectorScales: `top` is prefill_scale_range's.
template <typename CacheT, bool kVectorScales>
__global__ void __launch_bounds__(kOwnKvThreads) prefill_own_kv(const AttentionParams p, const uint2* top,
                                                                 __half* own_k, __half* own_v, int* ok) {
  // Per-vector scales: the range pass before this one lets it start once
  // that pass's own wait has returned (prefill_scale_range.cuh), so the
  // step's cache writes and metadata are final here; only `top` is the range
  // pass's, and each block's first row loads its bytes before the wait
  // (every store comes after it).
  // Per-tensor scales: this pass comes right after the cache writes.
  bool waited = !kVectorScales;
  if constexpr (!kVectorScales) wait_for_prior_grids();
  const PagedKVParams& kv = p.kv;
  int bad = 0;  // (block 0: query ranges out of order; written after the wait)
  if (blockIdx.x == 0) {
    for (int s = threadIdx.x; s < kv.num_seqs; s += blockDim.x) bad |= kv.cu_seqlens_q[s + 1] < kv.cu_seqlens_q[s];
    bad = __syncthreads_or(bad);
  }
  const int lanes = kv.head_dim / 8;
  const int64_t total = int64_t(p.num_tokens) * kv.num_kv_heads * lanes;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / lanes;
    const int c = static_cast<int>(i - row * lanes);
    const int t = static_cast<int>(row / kv.num_kv_heads);
    const int h = static_cast<int>(row - int64_t(t) * kv.num_kv_heads);
    uint2 k8 = make_uint2(0, 0), v8 = make_uint2(0, 0);
    float fk = 0.f, fv = 0.f;  // per-vector scales: the row's scales, then factors
    bool stored = false;        // a row of the step's own keys, on a page of the pool
    const int s = own_token_seq(p, t);
    if (s >= 0) {
      const int seq_len = clamp_seq_len(kv, kv.seq_lens[s]);
      const QueryRange qr = clamp_query_range(kv.cu_seqlens_q[s], kv.cu_seqlens_q[s + 1], p.num_tokens);
      const int pos = seq_len - qr.count + (t - qr.begin);
      if (!(p.mixed_queries > 0 && decode_takes(p, qr.count)) && pos >= 0 && pos < seq_len) {
        const int page = kv.block_tables[int64_t(s) * kv.max_pages + pos / kv.page_size];
        if (page_in_pool(kv, page)) {
          const int64_t at = kv_offset(kv, page, h, pos % kv.page_size) + 8 * c;
          k8 = *reinterpret_cast<const uint2*>(static_cast<const CacheT*>(kv.k_cache) + at);
          v8 = *reinterpret_cast<const uint2*>(static_cast<const CacheT*>(kv.v_cache) + at);
          stored = true;
          if constexpr (kVectorScales) {
            const int64_t sc = scale_offset(kv, page, h, pos % kv.page_size);
            fk = kv.k_scale[sc];
            fv = kv.v_scale[sc];
          }
        }
      }
    }
    if constexpr (kVectorScales) {
      if (!waited) {
        wait_for_prior_grids();
        waited = true;
      }
      if (stored) {
        const ItemScales f = ItemScales::make<CacheT>(top, kv.num_kv_heads, s, h, false);
        fk *= f.k;
        fv *= f.v;
      }
    }
    // The converters' conversions (prefill_convert.cuh), for the same bits.
    uint4 k16, v16;
    if constexpr (kVectorScales) {
      k16 = x8_to_scaled_half<CacheT>(k8, HalfFactor::make(fk));
      v16 = x8_to_scaled_half<CacheT>(v8, HalfFactor::make(fv));
    } else {
      k16 = x8_to_half<CacheT>(k8);
      v16 = x8_to_half<CacheT>(v8);
    }
    *reinterpret_cast<uint4*>(own_k + row * kv.head_dim + 8 * c) = k16;
    *reinterpret_cast<uint4*>(own_v + row * kv.head_dim + 8 * c) = v16;
  }
  if (!waited) wait_for_prior_grids();  // (a block without rows: it ends after the range pass)
  if (blockIdx.x == 0 && threadIdx.x == 0) *ok = !bad;
  // At the end, not at once as the other small kernels (common.cuh): with
  // the kernel's blocks launched while this pass ran, 1 x 2k prefills took
  // 2-3% longer (docs/PERFORMANCE.md, "What did not pay").
  allow_dependent_launch();
}

}  // namespace sm90
}  // namespace tileinfer
