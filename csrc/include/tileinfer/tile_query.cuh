// Queries of the tile kernel (attention_kernel.cuh) over a quantized cache:
// loaded through registers, times the key smoothing factors, then staged in
// shared memory as two int8 planes (int8 cache) or as fp16 (fp8 cache), each
// row scaled by its own power of two 2^e (quant.cuh). With a bf16 / fp16
// cache the queries are copied as they are (copy_query_rows, tile_io.cuh).
//
// Decode's few rows (<= 2 chunks per thread) are loaded before any tile's
// copies, with the block-table reads, and wait in registers: behind the
// copies they would wait for the first wave of copies of every block (H200,
// one sequence at 32k positions: the first tile landed 5.6 us after the
// block-table reads, against 2.8 for bf16, in the blocks' TILEINFER_TIMELINE
// stamps). Prefill's many rows are loaded when used.
#pragma once

#include <cstdint>

#include "attention_work.cuh"
#include "common.cuh"
#include "quant.cuh"
#include "tile_smem.cuh"

namespace tileinfer {

template <class Cfg>
struct QuantQueries {
  using QT = typename Cfg::QT;
  static constexpr int BM = Cfg::kBlockM;
  static constexpr int D = Cfg::D;
  static constexpr int kAll = BM * Cfg::kChunks;  // 16-byte chunks of the block's query rows
  static constexpr int kIters = (kAll + Cfg::kThreads - 1) / Cfg::kThreads;
  static constexpr bool kAhead = Cfg::kQuant && kIters <= 2;
  static constexpr int kUnroll = kAhead ? kIters : 1;  // prefill keeps a rolled loop
  struct Chunk {
    Vec16<QT> v;
    float s[8];
  };
  Chunk ahead[kAhead ? kIters : 1];  // decode: this thread's chunks, loaded early

  // Chunk c of the block's queries and its smoothing factors (zeros for padding rows).
  __device__ __forceinline__ static void load_chunk(const AttentionParams& p, const WorkItem& w, int c, Chunk& qc) {
    const float* smooth =
        p.kv.k_smooth == nullptr ? nullptr : p.kv.k_smooth + static_cast<int64_t>(w.kv_head) * p.kv.head_dim;
    const RowQuery rq = row_query(w, c / Cfg::kChunks);  // as the row table has it, without its barrier
    const int ch = c % Cfg::kChunks;
    const bool valid = rq.token >= 0 && ch * 8 < p.kv.head_dim;  // zeros past the head dim (tile_table.h)
#pragma unroll
    for (int e = 0; e < 8; ++e) qc.v.v[e] = from_float<QT>(0.f);
    if (valid)
      qc.v = *reinterpret_cast<const Vec16<QT>*>(static_cast<const QT*>(p.q) + rq.token * p.q_stride_token +
                                                 rq.head * p.q_stride_head + ch * 8);
#pragma unroll
    for (int e = 0; e < 8; ++e) qc.s[e] = !valid ? 0.f : smooth == nullptr ? 1.f : smooth[ch * 8 + e];
  }

  // Decode's chunks, into registers with the block-table reads.
  __device__ __forceinline__ void load_ahead(const AttentionParams& p, const WorkItem& w, int tid) {
    if constexpr (kAhead) {
#pragma unroll
      for (int it = 0; it < kIters; ++it)
        if (tid + it * Cfg::kThreads < kAll) load_chunk(p, w, tid + it * Cfg::kThreads, ahead[it]);
    }
  }

  // 2^e of query row `row`, once staged.
  __device__ __forceinline__ static float row_scale(const TileSmem<Cfg>& sh, int row) {
    return query_row_scale(__int_as_float(sh.row_qmax[row]));
  }

  // Each row's largest |q * smooth| into sh.row_qmax, then the rows into sh.q
  // (a block barrier between; the caller's barrier publishes sh.q).
  __device__ __forceinline__ void stage(const AttentionParams& p, const WorkItem& w, const TileSmem<Cfg>& sh,
                                        int tid) const {
    // Chunk c (the it-th of this thread) times the smoothing factors, in fp32.
    auto smoothed = [&](int it, int c, float (&x)[8]) {
      Chunk qc;
      if constexpr (kAhead) {
        qc = ahead[it];
      } else {
        load_chunk(p, w, c, qc);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = to_float(qc.v.v[e]) * qc.s[e];
    };
    // A row's kChunks chunks are consecutive lanes of one warp: their maximum
    // is a shuffle reduction, stored by the row's first lane.
#pragma unroll kUnroll
    for (int it = 0; it < kIters; ++it) {
      const int c = tid + it * Cfg::kThreads;
      if (c >= kAll) break;
      float x[8];
      smoothed(it, c, x);
      float amax = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) amax = isfinite(x[e]) ? fmaxf(amax, fabsf(x[e])) : INFINITY;
      amax = warp_max<Cfg::kChunks>(amax);
      if (c % Cfg::kChunks == 0) sh.row_qmax[c / Cfg::kChunks] = __float_as_int(amax);
    }
    __syncthreads();
    uint8_t* q8 = reinterpret_cast<uint8_t*>(sh.q);
#pragma unroll kUnroll
    for (int it = 0; it < kIters; ++it) {  // prefill's second pass reads L1
      const int c = tid + it * Cfg::kThreads;
      if (c >= kAll) break;
      float x[8];
      smoothed(it, c, x);
      const int row = c / Cfg::kChunks;
      const float qs = row_scale(sh, row);
      if constexpr (Cfg::kInt8) {
        // q = 256 hi + lo with hi in [-64, 64], lo in [-128, 127], for |q| <= 2^14.
        uint32_t hi[2] = {0, 0}, lo[2] = {0, 0};
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int q = static_cast<int>(fminf(fmaxf(rintf(x[e] * qs), -16384.f), 16384.f));
          const int h = (q + 128) >> 8;
          hi[e / 4] |= static_cast<uint32_t>(h & 0xff) << (8 * (e % 4));
          lo[e / 4] |= static_cast<uint32_t>((q - 256 * h) & 0xff) << (8 * (e % 4));
        }
        // 8 bytes: half of the 16-byte chunk (c % kChunks) / 2 of the row's D bytes.
        const int at = Cfg::stage_offset(row, (c % Cfg::kChunks) / 2) + 8 * (c % Cfg::kChunks % 2);
        *reinterpret_cast<uint2*>(q8 + at) = make_uint2(hi[0], hi[1]);
        *reinterpret_cast<uint2*>(q8 + BM * D + at) = make_uint2(lo[0], lo[1]);
      } else {
        // fp8: q * 2^e in fp16 (|q| < 2^14), columns permuted within each
        // 16-column group so that an fp16 A fragment pairs with the keys as
        // they come out of an ldmatrix of e4m3 rows (tile_scores.cuh):
        // logical columns (2c, 2c + 1) hold columns (4c, 4c + 1), (2c + 8,
        // 2c + 9) hold (4c + 2, 4c + 3). This chunk (half h of group G) has
        // pairs 4h .. 4h + 3: the even ones go to the group's first 8
        // columns, the odd ones to its last 8, at pair slots 2h, 2h + 1.
        uint32_t pr[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) pr[j] = pack2<__half>(x[2 * j] * qs, x[2 * j + 1] * qs);
        const int ch = c % Cfg::kChunks, h = ch % 2;
        *reinterpret_cast<uint2*>(q8 + 2 * Cfg::swz(row, ch - h) + 8 * h) = make_uint2(pr[0], pr[2]);
        *reinterpret_cast<uint2*>(q8 + 2 * Cfg::swz(row, ch - h + 1) + 8 * h) = make_uint2(pr[1], pr[3]);
      }
    }
  }
};

}  // namespace tileinfer
