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
// for one pass over the step's tokens.
//
// A chunk after a cached prefix would take its prefix's tiles through the
// converters once per work item (per 128 / group queries). So the pass also
// turns the cached prefix of such a chunk's sequence (the positions before
// its queries') into prefix rows, after the tokens' rows, while they fit
// the room the host gives (prefill.cu, prefix_room): sequences in order,
// each whole or not at all, the first row of each in pre_base. The producer
// copies a tile wholly inside the prefix from there; the one tile that
// holds both prefix and own positions goes through the converters. A chunk
// whose queries fit one item, or a fresh prompt, has no prefix rows. Each
// block plans the same rows from the metadata, after its tokens' rows (the
// plan's loads issued at the start, beside theirs), so that a fresh
// prompt's rows wait for nothing more.
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

#include <climits>
#include <cstdint>

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

// Prefix rows: how many sequences a step may have for its prefixes to be
// turned into fp16 (the plan below sits in each block's shared memory; the
// host passes no room past that count, prefill.cu).
constexpr int kPrefixSeqs = 1024;

// Sequence s's cached prefix positions (those before its queries', which
// the token rows do not hold) if it is a candidate for prefix rows, else 0:
// taken by prefill, with a cached prefix and more queries than one work
// item holds (`min_queries`: each prefix tile would be converted once per
// item).
__device__ __forceinline__ int prefix_positions(const AttentionParams& p, int min_queries, int s) {
  const PagedKVParams& kv = p.kv;
  if (s >= kv.num_seqs) return 0;
  const int seq_len = clamp_seq_len(kv, kv.seq_lens[s]);
  const QueryRange qr = clamp_query_range(kv.cu_seqlens_q[s], kv.cu_seqlens_q[s + 1], p.num_tokens);
  const bool prefill = !(p.mixed_queries > 0 && decode_takes(p, qr.count));
  return prefill && qr.count > min_queries && seq_len > qr.count ? seq_len - qr.count : 0;
}

// Which sequences' prefixes become rows: in each block, the candidates in
// order while their positions fit in `room` rows. first[s] is the row of
// sequence s's position 0 (a running sum, monotone), len[s] its prefix
// positions (0: not taken); `rows` the rows taken. `len0`: this thread's
// prefix_positions for sequence threadIdx.x, loaded by the caller early.
struct PrefixPlan {
  int first[kPrefixSeqs];
  int len[kPrefixSeqs];
  int rows;
  int scratch[kOwnKvThreads / 32];
};

__device__ __forceinline__ void plan_prefixes(const AttentionParams& p, int min_queries, int room, int len0,
                                              PrefixPlan& plan) {
  const PagedKVParams& kv = p.kv;
  constexpr int kWarps = kOwnKvThreads / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) plan.rows = 0;
  int64_t carry = 0;  // positions of the candidates before this chunk of sequences
  for (int s0 = 0; s0 < kv.num_seqs; s0 += kOwnKvThreads) {
    const int s = s0 + static_cast<int>(threadIdx.x);
    const int len = s0 == 0 ? len0 : prefix_positions(p, min_queries, s);
    // The block's exclusive sum of len (warp sums, then the warps' in turn).
    int upto = len;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int below = __shfl_up_sync(0xffffffffu, upto, d);
      if (lane >= d) upto += below;
    }
    __syncthreads();  // (the previous chunk's reads of scratch)
    if (lane == 31) plan.scratch[warp] = upto;
    __syncthreads();
    int64_t before = carry + upto - len, total = carry;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const int x = plan.scratch[w];
      if (w < warp) before += x;
      total += x;
    }
    if (s < kv.num_seqs) {
      const bool fits = len > 0 && before + len <= room;
      plan.first[s] = before < INT_MAX ? static_cast<int>(before) : INT_MAX;
      plan.len[s] = fits ? len : 0;
      if (fits) atomicMax(&plan.rows, static_cast<int>(before + len));
    }
    carry = total;
  }
  __syncthreads();
}

// The sequence whose prefix rows hold row r (< plan.rows), or -1.
__device__ __forceinline__ int prefix_row_seq(const PrefixPlan& plan, int num_seqs, int r) {
  int lo = 0, hi = num_seqs - 1;  // the last s with first[s] <= r (first[0] == 0)
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (plan.first[mid] <= r) lo = mid;
    else hi = mid - 1;
  }
  return r < plan.first[lo] + plan.len[lo] ? lo : -1;
}

// Eight values of one row of keys and values (one KV head, lane c of its
// head_dim / 8): position pos of sequence s (s -1, or pos outside [0, end):
// zeros) in fp16, the converters' values, stored at row `row`. Per-vector
// scales: `waited` says whether this thread has waited for the range pass,
// which it does here between its loads and its stores. `nan`: NaN stored
// instead (a test's way to see which outputs read these rows).
template <typename CacheT, bool kVectorScales>
__device__ __forceinline__ void own_kv_entry(const AttentionParams& p, const uint2* top, __half* own_k,
                                             __half* own_v, int64_t row, int s, int pos, int end, int h, int c,
                                             bool nan, bool& waited) {
  const PagedKVParams& kv = p.kv;
  uint2 k8 = make_uint2(0, 0), v8 = make_uint2(0, 0);
  float fk = 0.f, fv = 0.f;  // per-vector scales: the row's scales, then factors
  bool stored = false;        // a position of a sequence, on a page of the pool
  if (s >= 0 && pos >= 0 && pos < end) {
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
  if (nan) k16 = v16 = make_uint4(0x7e007e00u, 0x7e007e00u, 0x7e007e00u, 0x7e007e00u);
  const int64_t at = (row * kv.num_kv_heads + h) * kv.head_dim + 8 * c;
  *reinterpret_cast<uint4*>(own_k + at) = k16;
  *reinterpret_cast<uint4*>(own_v + at) = v16;
}

// One thread per 8 values of a row, keys and values: rows [0, num_tokens)
// the step's tokens, then (prefix_room > 0) prefix rows for the sequences
// the plan takes, planned once the tokens' rows are done (the plan's loads
// were issued at the start, beside the first row's), and pre_base[s]:
// their first row past the tokens', or -1. kVectorScales: `top` is
// prefill_scale_range's. `nan_rows` (tests only; prefill.cu): bit 0 fills
// the tokens' rows with NaN, bit 1 the prefix rows.
template <typename CacheT, bool kVectorScales>
__global__ void __launch_bounds__(kOwnKvThreads)
    prefill_own_kv(const AttentionParams p, const uint2* top, __half* own_k, __half* own_v, int* ok, int* pre_base,
                   int prefix_room, int min_queries, int nan_rows) {
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
  const bool prefixes = prefix_room > 0;  // (the host's: kv.num_seqs <= kPrefixSeqs then)
  const int len0 = prefixes ? prefix_positions(p, min_queries, threadIdx.x) : 0;
  const int lanes = kv.head_dim / 8;
  const int64_t row_threads = int64_t(kv.num_kv_heads) * lanes;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < int64_t(p.num_tokens) * row_threads; i += stride) {
    const int t = static_cast<int>(i / row_threads);
    const int rest = static_cast<int>(i - t * row_threads);
    int s = own_token_seq(p, t), pos = 0, seq_len = 0;
    if (s >= 0) {
      seq_len = clamp_seq_len(kv, kv.seq_lens[s]);
      const QueryRange qr = clamp_query_range(kv.cu_seqlens_q[s], kv.cu_seqlens_q[s + 1], p.num_tokens);
      pos = seq_len - qr.count + (t - qr.begin);
      if (p.mixed_queries > 0 && decode_takes(p, qr.count)) s = -1;
    }
    own_kv_entry<CacheT, kVectorScales>(p, top, own_k, own_v, t, s, pos, seq_len, rest / lanes, rest % lanes,
                                        (nan_rows & 1) != 0, waited);
  }
  // (A step without candidates, a fresh prompt's, skips the plan: its
  // sequences fit one block's threads.)
  __shared__ PrefixPlan plan;
  const bool planned = prefixes && (kv.num_seqs > kOwnKvThreads || __syncthreads_or(len0 > 0));
  if (planned) {
    plan_prefixes(p, min_queries, prefix_room, len0, plan);
    for (int64_t i = first; i < int64_t(plan.rows) * row_threads; i += stride) {
      const int r = static_cast<int>(i / row_threads);
      const int rest = static_cast<int>(i - r * row_threads);
      const int s = prefix_row_seq(plan, kv.num_seqs, r);
      const int pos = s >= 0 ? r - plan.first[s] : 0;
      own_kv_entry<CacheT, kVectorScales>(p, top, own_k, own_v, p.num_tokens + int64_t(r), s, pos,
                                          s >= 0 ? plan.len[s] : 0, rest / lanes, rest % lanes, (nan_rows & 2) != 0,
                                          waited);
    }
  }
  if (!waited) wait_for_prior_grids();  // (a block without rows: it ends after the range pass)
  if (blockIdx.x == 0) {
    if (threadIdx.x == 0) *ok = !bad;
    for (int s = threadIdx.x; prefixes && s < kv.num_seqs; s += blockDim.x)
      pre_base[s] = planned && plan.len[s] > 0 ? plan.first[s] : -1;
  }
  // At the end, not at once as the other small kernels (common.cuh): with
  // the kernel's blocks launched while this pass ran, 1 x 2k prefills took
  // 2-3% longer (docs/PERFORMANCE.md, "What did not pay").
  allow_dependent_launch();
}

}  // namespace sm90
}  // namespace tileinfer
