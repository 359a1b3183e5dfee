// Epilogue of the Hopper prefill kernel: each consumer thread normalizes its
// two rows of O and stores them straight from registers (pairs of elements,
// rounded once from fp32), with the row's natural-log lse when asked for.
// Rows of no query are left untouched. `factor` multiplies each row (a
// quantized cache's v_scale; NaN for a row whose queries held a non-finite
// value, which then gets NaN output and lse). `sink`: a sink logit (log2
// units) that joins each row only now (quantized caches: SoftmaxRow::join_sink),
// -inf for none or one already in the row. No shared memory: the next
// item's copies already fill the ring while the epilogue runs.
#pragma once

#include "../attention_work.cuh"
#include "../softmax.cuh"
#include "prefill_tile.h"

namespace tileinfer {
namespace sm90 {

template <class Cfg>
__device__ __forceinline__ void prefill_store(const PrefillParams& p, const WorkItem& w, OnlineSoftmax<2, 4>& smx,
                                              const float (&o)[Cfg::D / 2], int r0, int quad,
                                              const float (&factor)[2], const float (&sink)[2]) {
  using T = typename Cfg::QT;
  smx.reduce_sums();
#pragma unroll
  for (int R = 0; R < 2; ++R) {
    const float keep = smx.row[R].join_sink(sink[R]);
    SoftmaxResult res = softmax_result(smx.row[R].m, smx.row[R].l);
    res.inv_sum *= factor[R] * keep;
    if (isnan(factor[R])) res.lse = factor[R];
    const RowQuery rq = row_query(w, r0 + 8 * R);
    if (rq.token < 0) continue;
    T* dst = output_row<T>(p.a, rq.token, rq.head) + 2 * quad;
#pragma unroll
    for (int j = 0; j < Cfg::D / 8; ++j)
      if (8 * j < p.a.kv.head_dim)  // a head dim below the tile's: its own columns only (tile_table.h)
        *reinterpret_cast<uint32_t*>(dst + 8 * j) =
            pack2<T>(o[4 * j + 2 * R] * res.inv_sum, o[4 * j + 2 * R + 1] * res.inv_sum);
    float* lse = output_lse(p.a, rq.token, rq.head);
    if (quad == 0 && lse != nullptr) *lse = res.lse;
  }
}

}  // namespace sm90
}  // namespace tileinfer
