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
// one meanwhile), the warpgroup writes its rows there and stores them as
// 16-byte chunks, each warp whole rows; otherwise each thread stores its
// element pairs straight from registers (four bytes each, a warp's store
// spread over eight rows). The ring's stages are never used: the next item's
// copies already fill them while the epilogue runs.
#pragma once

#include "../attention_work.cuh"
#include "../softmax.cuh"
#include "async.cuh"
#include "prefill_tile.h"

namespace tileinfer {
namespace sm90 {

constexpr int kEpilogueBarrier = 6;  // named barriers 6, 7: consumer w's rows are staged (kStagedStore)

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
#pragma unroll
  for (int R = 0; R < 2; ++R) {
    const int r = r0 + 8 * R;
    // (Cfg::kProbBias: the sums carry a power of two, which the lse drops.)
    SoftmaxResult res = softmax_result_with_sink(smx.row[R], sink[R], Cfg::kProbBias);
    res.inv_sum *= factor[R];
    if (isnan(factor[R])) res.lse = factor[R];
    if constexpr (Cfg::kStagedStore) {
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
        *reinterpret_cast<uint32_t*>(q_tile + chunk_at(r, j) + 4 * quad) =
            pack2<T>(o[4 * j + 2 * R] * res.inv_sum, o[4 * j + 2 * R + 1] * res.inv_sum);
    }
    const RowQuery rq = row_query(w, r);
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
    named_sync(kEpilogueBarrier + wg, 128);  // the warpgroup's rows are written
    constexpr int kChunks = D / 8;  // 16-byte chunks of a row
#pragma unroll
    for (int x = tid; x < 64 * kChunks; x += 128) {
      const int r = 64 * wg + x / kChunks;
      const int c = x % kChunks;
      const RowQuery rq = row_query(w, r);
      if (rq.token < 0 || 8 * c >= p.a.kv.head_dim) continue;
      *reinterpret_cast<uint4*>(output_row<T>(p.a, rq.token, rq.head) + 8 * c) =
          *reinterpret_cast<const uint4*>(q_tile + chunk_at(r, c));
    }
  }
}

}  // namespace sm90
}  // namespace tileinfer
