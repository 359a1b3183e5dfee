// The tile kernel's epilogue (attention_kernel.cuh): once every warp's keys
// are done, each row's softmax is finished (the key-slice warps of decode
// merging their parts of a row first), the accumulators are scaled into
// shared memory as fp32 rows, and whole rows go out as 16-byte stores: to
// `out`, or to the split's fp32 partial (decode), with the lse; or the blocks
// of a cluster merge their splits' rows together (cluster_merge_rows). A
// walking decode block without partials merges each split's rows into its
// running merge instead (split_merge_rows), and writes `out` after its last
// split (split_merge_finish).
#pragma once

#include "attention_work.cuh"
#include "cluster_merge.cuh"
#include "quant.cuh"
#include "softmax.cuh"
#include "split_merge.cuh"
#include "tile_io.cuh"
#include "tile_smem.cuh"

namespace tileinfer {

// A walking decode block that merges its splits itself (no partials;
// split_merge.cuh, and combine.cuh does the same from partials): each row's
// running state in shared memory (split_acc, split_max, split_den, past the
// rest, so that the next split's copies do not overwrite it). A thread takes
// the rows' columns that store_output_rows gives it for fp32 partials, four
// at a time, and their values are those a partial would have held.
template <class Cfg>
__device__ __forceinline__ void split_merge_start(const TileSmem<Cfg>& sh, int tid) {
  for (int i = tid; i < Cfg::kBlockM * Cfg::D; i += Cfg::kThreads) sh.split_acc[i] = 0.f;
  for (int r = tid; r < Cfg::kBlockM; r += Cfg::kThreads) {
    sh.split_max[r] = -INFINITY;
    sh.split_den[r] = 0.f;
  }
}

// The split just finished (its key-slice warps' rows staged at o_s, kStride
// floats apart, their lses in sh.lse, after a barrier) into the running
// merge. The rows' max and den move only once every thread has read them and
// o_s (a barrier here); the next read is the next split's, behind the
// barriers of its key loop, or split_merge_finish's.
template <class Cfg, int kStride = Cfg::kOStride>
__device__ __forceinline__ void split_merge_rows(const AttentionParams& p, const TileSmem<Cfg>& sh, const float* o_s,
                                                 int tid) {
  constexpr int BM = Cfg::kBlockM;
  constexpr int kVecs = Cfg::D / 4;
  for (int idx = tid; idx < BM * kVecs; idx += Cfg::kThreads) {
    const int row = idx / kVecs;
    const int col = (idx % kVecs) * 4;
    const float lse = sh.lse[row];
    if (sh.row_token[row] < 0 || col >= p.kv.head_dim || !merges_split(lse)) continue;
    const MergeStep step = merge_step(sh.split_max[row], lse);
    const float4 o = staged_row_sum<BM, Cfg::kWarpsN, kStride>(o_s, row, col);
    float4* acc = reinterpret_cast<float4*>(sh.split_acc + row * Cfg::D + col);
    float4 a = *acc;
    a.x = merge_acc(a.x, o.x, step);
    a.y = merge_acc(a.y, o.y, step);
    a.z = merge_acc(a.z, o.z, step);
    a.w = merge_acc(a.w, o.w, step);
    *acc = a;
  }
  __syncthreads();
  if (tid < BM && sh.row_token[tid] >= 0 && merges_split(sh.lse[tid])) {
    const MergeStep step = merge_step(sh.split_max[tid], sh.lse[tid]);
    sh.split_max[tid] = step.max;
    sh.split_den[tid] = merge_den(sh.split_den[tid], step);
  }
}

// After the block's last split: its rows of `out` and their lse, as combine
// would have written them from the partials.
template <class Cfg>
__device__ __forceinline__ void split_merge_finish(const AttentionParams& p, const TileSmem<Cfg>& sh, int tid) {
  using QT = typename Cfg::QT;
  static_assert(sizeof(QT) == 2, "walking blocks take 16-bit queries");
  constexpr int kVecs = Cfg::D / 4;
  __syncthreads();  // the rows' last max and den
  for (int idx = tid; idx < Cfg::kBlockM * kVecs; idx += Cfg::kThreads) {
    const int row = idx / kVecs;
    const int col = (idx % kVecs) * 4;
    const int token = sh.row_token[row];
    if (token < 0 || col >= p.kv.head_dim) continue;
    const float den = sh.split_den[row];
    const float inv = merged_inv(den);
    const float4 a = *reinterpret_cast<const float4*>(sh.split_acc + row * Cfg::D + col);
    const int head = sh.row_head[row];
    *reinterpret_cast<uint2*>(output_row<QT>(p, token, head) + col) =
        make_uint2(pack2<QT>(merged_out(a.x, den, inv), merged_out(a.y, den, inv)),
                   pack2<QT>(merged_out(a.z, den, inv), merged_out(a.w, den, inv)));
    float* lse = output_lse(p, token, head);
    if (col == 0 && lse != nullptr) *lse = merged_lse(sh.split_max[row], den);
  }
}

// Each of this lane's rows' factor from its accumulator to the row's share
// of the normalized output (the key-slice warps' parts of a row merged in a
// fixed order), and the rows' lse into sh.lse. sm / o: this lane's rows'
// softmax states and accumulators (rows row_of(R)); vmax and row_bad: the
// quantized caches' value-scale maximum and non-finite query rows.
template <class Cfg, class Work, int kR, class RowOf>
__device__ __forceinline__ void row_out_scales(const AttentionParams& p, const WorkItem& w, const TileSmem<Cfg>& sh,
                                               OnlineSoftmax<kR, 4>& sm, float vmax,
                                               const bool (&row_bad)[Cfg::kQuant ? kR : 1], int warp_n, int quad,
                                               RowOf row_of, float (&out_scale)[kR]) {
  constexpr int BM = Cfg::kBlockM;
  sm.reduce_sums();
  if constexpr (Cfg::kWarpsN == 1) {
#pragma unroll
    for (int R = 0; R < kR; ++R) {
      const SoftmaxResult res = softmax_result_with_sink(sm.row[R], Work::sink(p, w, sh.row_head[row_of(R)]));
      out_scale[R] = res.inv_sum;
      if (quad == 0) sh.lse[row_of(R)] = res.lse;
    }
  } else {
    // The key-slice warps hold disjoint parts of the same rows: merge their
    // (m, l) in a fixed order, then scale each warp's accumulator into the total.
    if (quad == 0) {
#pragma unroll
      for (int R = 0; R < kR; ++R) {
        sh.merge[(warp_n * BM + row_of(R)) * 2] = sm.row[R].m;
        sh.merge[(warp_n * BM + row_of(R)) * 2 + 1] = sm.row[R].l;
      }
    }
    __syncthreads();
#pragma unroll
    for (int R = 0; R < kR; ++R) {
      SoftmaxRow parts[Cfg::kWarpsN];
#pragma unroll
      for (int wn = 0; wn < Cfg::kWarpsN; ++wn) {
        parts[wn].m = sh.merge[(wn * BM + row_of(R)) * 2];
        parts[wn].l = sh.merge[(wn * BM + row_of(R)) * 2 + 1];
      }
      const SoftmaxRow total = merge_rows(parts);
      const SoftmaxResult res = softmax_result_with_sink(total, Work::sink(p, w, sh.row_head[row_of(R)]));
      out_scale[R] = fast_exp2(sm.row[R].m - total.offset()) * res.inv_sum;
      if (warp_n == 0 && quad == 0) sh.lse[row_of(R)] = res.lse;
    }
  }
  if constexpr (Cfg::kQuant) {
#pragma unroll
    for (int R = 0; R < kR; ++R) {
      out_scale[R] *= vmax * (1.f / kProbHeadroom);  // the accumulator is in units of vmax / 2^15
      if (row_bad[R]) {  // a non-finite query value: NaN, as the reference's scores would give
        out_scale[R] = __int_as_float(0x7fc00000);
        if (warp_n == 0 && quad == 0) sh.lse[row_of(R)] = out_scale[R];  // after this thread's own lse write
      }
    }
  }
}

// This lane's rows' shares of the output (accumulator times out_scale) into
// the warp's slice of o_s, rows kStride floats apart. The key-slice warps
// (decode) skip rows of no query, which are never stored: most of the rows
// when a group packs fewer than the tile has (a GQA-4 group: 4 of 16).
// (Prefill's int8 tile spilled registers with it.)
template <class Cfg, int kStride, int kR, class RowOf>
__device__ __forceinline__ void stage_out_rows(const TileSmem<Cfg>& sh, const float (&o)[kR][Cfg::D / 4],
                                               const float (&out_scale)[kR], float* o_s, int warp_n, int quad,
                                               RowOf row_of) {
  constexpr int D = Cfg::D;
#pragma unroll
  for (int R = 0; R < kR; ++R) {
    if (Cfg::kKeySlices && sh.row_token[row_of(R)] < 0) continue;
    float* row = o_s + (warp_n * Cfg::kBlockM + row_of(R)) * kStride;
    const float f = out_scale[R];
    if constexpr (Cfg::kValuesInRegs) {  // columns 16 ch + 4 quad .. + 3 (tile_pv, tile_products.cuh)
#pragma unroll
      for (int ch = 0; ch < D / 16; ++ch)
        *reinterpret_cast<float4*>(row + 16 * ch + 4 * quad) =
            make_float4(o[R][4 * ch] * f, o[R][4 * ch + 2] * f, o[R][4 * ch + 1] * f, o[R][4 * ch + 3] * f);
    } else {
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
        *reinterpret_cast<float2*>(row + 8 * j + 2 * quad) = make_float2(o[R][2 * j] * f, o[R][2 * j + 1] * f);
    }
  }
}

// The rows' lse (sh.lse) out, to the output's lse or the split's partial.
template <class Cfg, class Work>
__device__ __forceinline__ void store_row_lse(const AttentionParams& p, const WorkItem& w, const TileSmem<Cfg>& sh,
                                              int tid) {
  if (tid < Cfg::kBlockM && sh.row_token[tid] >= 0) {
    float* lse = Work::lse_at(p, w, sh.row_token[tid], sh.row_head[tid]);
    if (lse != nullptr) *lse = sh.lse[tid];
  }
}

// The end of one split inside a walk that runs on across split boundaries
// (attention_kernel.cuh, DecodeWalkWork::walk_through): the split's rows go
// into the block's running merge (`merges`) or out to the split's partial,
// as tile_epilogue would have put them (row_out_scales, stage_out_rows, then
// split_merge_rows or store_output_rows: the same values), but staged in
// o_s, the stage of the tile just finished, kStride = D floats a row, so
// that the copies of the next tiles stay in flight. Called by every thread
// after the barrier that ends the split's last tile; o_s and sh.lse are
// free again when it returns (split_merge_rows' barrier, or the one here).
template <class Cfg, class Work, int kR, class RowOf>
__device__ __forceinline__ void split_walk_boundary(const AttentionParams& p, const WorkItem& w,
                                                    const TileSmem<Cfg>& sh, OnlineSoftmax<kR, 4>& sm,
                                                    const float (&o)[kR][Cfg::D / 4], float* o_s, int tid,
                                                    int warp_n, int quad, RowOf row_of, bool merges) {
  static_assert(!Cfg::kQuant, "a quantized tile's stage is smaller than its o_s");
  static_assert(Cfg::kWarpsN * Cfg::kBlockM * Cfg::D * 4 <= 2 * Cfg::kTileBytes, "o_s fits one stage");
  float out_scale[kR];
  const bool row_bad[1] = {false};
  row_out_scales<Cfg, Work>(p, w, sh, sm, 0.f, row_bad, warp_n, quad, row_of, out_scale);
  stage_out_rows<Cfg, Cfg::D>(sh, o, out_scale, o_s, warp_n, quad, row_of);
  __syncthreads();
  if (merges) {
    if constexpr (Cfg::kMergesSplits) split_merge_rows<Cfg, Cfg::D>(p, sh, o_s, tid);
    return;
  }
  store_output_rows<Cfg::kBlockM, Cfg::D, Cfg::kThreads, Cfg::kWarpsN, Cfg::D>(
      o_s, sh.row_token, sh.row_head, tid, p.kv.head_dim,
      [&](int token, int head) { return Work::partial_row(p, w, token, head); });
  store_row_lse<Cfg, Work>(p, w, sh, tid);
  __syncthreads();
}

// The block's output after its key loop: its rows of the output or of the
// split's partial, or of a cluster's or a walk's merge. Starts with a block
// barrier: the K / V stages become o_s.
// merges: a walking block without partials (split_merge_rows).
template <class Cfg, class Work, int kR, class RowOf>
__device__ __forceinline__ void tile_epilogue(const AttentionParams& p, const WorkItem& w, const TileSmem<Cfg>& sh,
                                              OnlineSoftmax<kR, 4>& sm, float (&o)[kR][Cfg::D / 4], float vmax,
                                              const bool (&row_bad)[Cfg::kQuant ? kR : 1], int tid, int warp_n,
                                              int quad, RowOf row_of, bool merges = false) {
  using QT = typename Cfg::QT;
  constexpr int D = Cfg::D;
  constexpr int BM = Cfg::kBlockM;
  cp_async_wait<0>();
  __syncthreads();     // K/V stages are free: o_s may overwrite them
  TILEINFER_STAMP(6);  // every warp's keys done
  float out_scale[kR];
  row_out_scales<Cfg, Work>(p, w, sh, sm, vmax, row_bad, warp_n, quad, row_of, out_scale);
  stage_out_rows<Cfg, Cfg::kOStride>(sh, o, out_scale, sh.o, warp_n, quad, row_of);
  __syncthreads();
  TILEINFER_STAMP(7);  // warps' parts in shared memory
  if constexpr (Work::kPartials && !Work::kWalks) {
    if (p.cluster_splits > 1) {  // block-uniform
      cluster_merge_rows<Cfg>(p, sh, tid);
      return;
    }
  }
  if constexpr (Work::kWalks && Cfg::kMergesSplits) {
    if (merges) {
      split_merge_rows<Cfg>(p, sh, sh.o, tid);
      return;
    }
  }

  // 16-byte stores of whole rows of elements O at row_ptr(token, head); the
  // key-slice warps' parts add up in a fixed order.
  auto store_rows = [&](auto row_ptr) {
    store_output_rows<BM, D, Cfg::kThreads, Cfg::kWarpsN, Cfg::kOStride>(sh.o, sh.row_token, sh.row_head, tid,
                                                                          p.kv.head_dim, row_ptr);
  };
  bool partials = false;
  if constexpr (Work::kPartials) partials = Work::writes_partials(p);
  if (partials) {
    if constexpr (Work::kPartials)
      store_rows([&](int token, int head) { return Work::partial_row(p, w, token, head); });
  } else {
    store_rows([&](int token, int head) { return output_row<QT>(p, token, head); });
  }
  store_row_lse<Cfg, Work>(p, w, sh, tid);
  TILEINFER_STAMP(5);
}

// A walked split that holds no key (Work::lse_only): its rows' lse only, -inf.
template <class Cfg, class Work>
__device__ __forceinline__ void tile_neutral_lse(const AttentionParams& p, const WorkItem& w,
                                                 const TileSmem<Cfg>& sh, int tid) {
  for (int r = tid; r < Cfg::kBlockM; r += Cfg::kThreads)
    if (sh.row_token[r] >= 0) *Work::lse_at(p, w, sh.row_token[r], sh.row_head[r]) = -INFINITY;
}

}  // namespace tileinfer
