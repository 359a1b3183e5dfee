// Epilogue of the Hopper prefill kernel: each consumer thread normalizes its
// two rows of O (rounded once from fp32), with the row's natural-log lse when
// asked for. Rows of no query are left untouched. `factor` multiplies each
// row (a quantized cache's v_scale; NaN for a row whose queries held a
// non-finite value, which then gets NaN output and lse). `sink`: each row's
// sink logit (log2 units, -inf for none), which joins the row only now
// (SoftmaxRow::join_sink).
//
// Where the item's query tile stays in its buffer until the epilogue
// (Cfg::kStagedStore: two query buffers, so the producer fills the other
// one meanwhile), the warpgroup writes its rows there (stmatrix, four 8 x 8
// blocks an instruction) and stores them as 16-byte chunks, each warp whole
// rows; otherwise each thread stores its element pairs straight from
// registers (four bytes each, a warp's store spread over eight rows). The
// ring's stages are never used: the next item's copies already fill them
// while the epilogue runs. Rows map to (token, head) by a shift and a mask
// (row_query<true>: the kernel's groups are powers of two).
#pragma once

#include "../attention_work.cuh"
#include "../softmax.cuh"
#include "async.cuh"
#include "prefill_tile.h"

namespace tileinfer {
namespace sm90 {

constexpr int kEpilogueBarrier = 8;  // named barriers 8-10: consumer w's rows are staged (kStagedStore)

// `q_tile`: the item's query buffer (Cfg::kStagedStore), of which this
// warpgroup (`wg`, thread `tid` of its 128) owns rows [64 wg, 64 wg + 64) in
// the 128-byte-swizzle layout of wgmma.cuh.
template <class Cfg>
__device__ __forceinline__ void prefill_store(const PrefillParams& p, const WorkItem& w, OnlineSoftmax<2, 4>& smx,
                                              const float (&o)[Cfg::D / 2], int r0, int quad,
                                              const float (&factor)[2], const float (&sink)[2], uint8_t* q_tile,
                                              int wg, int tid) {
  using T = typename Cfg::QT;
  constexpr int D = Cfg::D;
  constexpr int BM = Cfg::kBlockM;
  // Byte offset of 16-byte chunk c (elements 8 c ..) of row r in the query tile's layout.
  auto chunk_at = [](int r, int c) { return (c >> 3) * BM * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4); };
  smx.reduce_sums();
  float inv_sum[2];
#pragma unroll
  for (int R = 0; R < 2; ++R) {
    // (Cfg::kProbBias: the sums carry a power of two, which the lse drops.)
    SoftmaxResult res = softmax_result_with_sink(smx.row[R], sink[R], Cfg::kProbBias);
    res.inv_sum *= factor[R];
    if (isnan(factor[R])) res.lse = factor[R];
    inv_sum[R] = res.inv_sum;
    const RowQuery rq = row_query<true>(w, r0 + 8 * R);
    if (rq.token < 0) continue;
    if constexpr (!Cfg::kStagedStore) {
      T* dst = output_row<T>(p.a, rq.token, rq.head) + 2 * quad;
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
        if (8 * j < p.a.kv.head_dim)  // a head dim below the tile's: its own columns only (tile_table.h)
          *reinterpret_cast<uint32_t*>(dst + 8 * j) =
              pack2<T>(o[4 * j + 2 * R] * res.inv_sum, o[4 * j + 2 * R + 1] * res.inv_sum);
    }
    float* lse = output_lse(p.a, rq.token, rq.head);
    if (quad == 0 && lse != nullptr) *lse = res.lse;
  }
  if constexpr (Cfg::kStagedStore) {
    // Staged with stmatrix, four 8 x 8 blocks a store: chunks j and j + 1 of
    // the warp's rows 0-7 and 8-15 (registers 4 j + 2 R, + 1 of each thread
    // are row R's elements of chunk j). Lane l gives row l % 8 + 8 (l / 8 % 2)
    // of chunk j + l / 16; j is even, so the chunk's swizzle is j's with its
    // low bit set from l / 16.
    const int lane = tid & 31;
    const int row = 64 * wg + 16 * (tid >> 5) + (lane & 7) + 8 * ((lane >> 3) & 1);
    const uint32_t lane_row = smem_u32(q_tile) + row * 128;
    const uint32_t flip = static_cast<uint32_t>((lane >> 4) ^ (lane & 7)) << 4;
#pragma unroll
    for (int j = 0; j < D / 8; j += 2) {
      uint32_t r[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int x = 4 * (j + (m >> 1)) + 2 * (m & 1);
        r[m] = pack2<T>(o[x] * inv_sum[m & 1], o[x + 1] * inv_sum[m & 1]);
      }
      stmatrix_x4(lane_row + (j >> 3) * BM * 128 + ((static_cast<uint32_t>(j & 7) << 4) ^ flip), r[0], r[1], r[2],
                  r[3]);
    }
    named_sync(kEpilogueBarrier + wg, 128);  // the warpgroup's rows are written
    // Each thread stores one chunk column of every kRowStep-th row: its
    // rows share the swizzle (kRowStep is a multiple of 8), so their
    // staged chunks lie kRowStep rows apart.
    constexpr int kChunks = D / 8;  // 16-byte chunks of a row
    constexpr int kRowStep = 128 / kChunks;
    static_assert(kRowStep % 8 == 0, "rows of one swizzle");
    const int c = tid % kChunks;
    const int first = 64 * wg + tid / kChunks;
    const uint8_t* src = q_tile + chunk_at(first, c);
    if (8 * c < p.a.kv.head_dim) {  // a head dim below the tile's: its own columns only
#pragma unroll
      for (int k = 0; k < 64 / kRowStep; ++k) {
        const RowQuery rq = row_query<true>(w, first + k * kRowStep);
        if (rq.token >= 0)
          *reinterpret_cast<uint4*>(output_row<T>(p.a, rq.token, rq.head) + 8 * c) =
              *reinterpret_cast<const uint4*>(src + k * kRowStep * 128);
      }
    }
  }
}

}  // namespace sm90
}  // namespace tileinfer
