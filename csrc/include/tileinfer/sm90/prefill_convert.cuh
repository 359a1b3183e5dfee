// Converters of the Hopper prefill kernel over a quantized cache (int8 or
// fp8 e4m3): warps 1-3 of the producer warpgroup turn each raw K / V tile
// (the stored bytes and their rows' scales, prefill_producer.cuh) into an
// operand tile of the queries' type T in the stage, which the consumers then
// take as they take a bf16 / fp16 cache's tiles. Per element, in fp32:
//   key   (x * k_scale) * k_smooth[column]   (k_smooth: the key smoothing factors, or 1)
//   value  x * v_scale
// x the stored value (exact in fp32), then rounded once to T: the numerics of
// dequantizing the cache and running the bf16 / fp16 kernel on it.
//
// Rows at or past the item's key end (slots that hold anything, NaN scales
// included) and rows of boxes on pages outside the pool (no scales were
// copied) become zeros, so that no NaN reaches P V; the consumers mask those
// keys as they do on a bf16 cache (stage_mask, handed on from the raw slot).
//
// Thread layout: 8 elements (one 16-byte chunk of T) per step; thread t of
// the 96 takes chunk t % (D / 8) of rows t / (D / 8), + 96 / (D / 8), ...:
// each warp reads whole raw rows and writes whole 128-byte swizzled rows, and
// a thread's columns (and its smoothing factors) stay the same.
#pragma once

#include "../attention_work.cuh"
#include "../common.cuh"
#include "../quant.cuh"
#include "prefill_scheduler.cuh"
#include "prefill_smem.cuh"
#include "wgmma.cuh"

namespace tileinfer {
namespace sm90 {

// One raw tile -> one operand tile (128-byte swizzle, tile_io's layout of
// attention_wgmma.cuh: 16-byte chunk c of row r at block c / 8, chunk
// (c % 8) ^ (r % 8)).
template <class Cfg, bool kKeys>
__device__ __forceinline__ void convert_tile(const uint8_t* raw, const float* scales, uint8_t* tile, int ctid,
                                             int valid, uint32_t outside, int box_shift, bool per_tensor,
                                             float tensor_scale, const float (&smooth)[8]) {
  using T = typename Cfg::T;
  using Q = QuantFormat<typename Cfg::CacheT>;
  constexpr int D = Cfg::D;
  constexpr int BN = Cfg::kBlockN;
  constexpr int kChunks = D / 8;
  constexpr int kRowStep = 32 * Cfg::kConverterWarps / kChunks;
  static_assert((32 * Cfg::kConverterWarps) % kChunks == 0, "a thread's chunk stays the same");
  constexpr int kRowsPerThread = (BN + kRowStep - 1) / kRowStep;
  constexpr int kBatch = 2;  // rows in flight per thread: their loads first, then their conversions
  const int ch = ctid % kChunks;
  const int row0 = ctid / kChunks;
  uint8_t* dst = tile + (ch >> 3) * BN * 128;
#pragma unroll 1
  for (int b = 0; b < kRowsPerThread; b += kBatch) {
    uint2 in[kBatch];
    float s[kBatch];
    bool take[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int r = row0 + (b + j) * kRowStep;
      take[j] = r < valid && ((outside >> (r >> box_shift)) & 1) == 0;  // (valid <= BN)
      in[j] = take[j] ? *reinterpret_cast<const uint2*>(raw + r * D + ch * 8) : make_uint2(0, 0);
      s[j] = !take[j] ? 0.f : per_tensor ? tensor_scale : scales[r];
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int r = row0 + (b + j) * kRowStep;
      if (r >= BN) break;
      float x[8];
      Q::x4_to_float(in[j].x, x);
      Q::x4_to_float(in[j].y, x + 4);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        x[e] *= s[j];  // 0 for rows not taken: their raw bytes and scales may be anything
        if constexpr (kKeys) x[e] *= smooth[e];
      }
      const uint4 out =
          make_uint4(pack2<T>(x[0], x[1]), pack2<T>(x[2], x[3]), pack2<T>(x[4], x[5]), pack2<T>(x[6], x[7]));
      *reinterpret_cast<uint4*>(dst + r * 128 + (((ch & 7) ^ (r & 7)) << 4)) = out;
    }
  }
}

// The converter warps' loop: the items and tiles of the producer, in the
// same order (the same scheduler), one stage per tile.
template <class Cfg>
__device__ __forceinline__ void prefill_convert(const PrefillParams& p, const PrefillSmem<Cfg>& sm,
                                                const PrefillScheduler& sched) {
  constexpr int BM = Cfg::kBlockM;
  constexpr int BN = Cfg::kBlockN;
  constexpr int kChunks = Cfg::D / 8;
  const int ctid = threadIdx.x - 32;  // warps 1-3
  const int lane = threadIdx.x & 31;
  const PagedKVParams& kv = p.a.kv;
  const int box_shift = __ffs(p.box_rows) - 1;
  const bool per_tensor = kv.scale_per_tensor;
  const float k_tensor = per_tensor ? kv.k_scale[0] : 0.f;
  const float v_tensor = per_tensor ? kv.v_scale[0] : 0.f;
  const float no_smooth[8] = {};  // unused for values

  uint32_t tiles = 0;
  for (int round = sched.template next_active<BM>(p, 0); sched.valid(round);
       round = sched.template next_active<BM>(p, round + 1)) {
    const WorkItem w = sched.template make<BM>(p, round);
    if (!w.active) continue;

    // This thread's columns' smoothing factors (1 without; 0 past the head dim,
    // whose raw bytes are zeros).
    float smooth[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int col = (ctid % kChunks) * 8 + e;
      smooth[e] = col >= kv.head_dim          ? 0.f
                  : kv.k_smooth == nullptr ? 1.f
                                           : kv.k_smooth[static_cast<int64_t>(w.kv_head) * kv.head_dim + col];
    }

    const int num_tiles = w.key_end > w.key_begin ? ceil_div(w.key_end - w.key_begin, BN) : 0;
    for (int i = 0; i < num_tiles; ++i, ++tiles) {
      const int valid = min(BN, w.key_end - (w.key_begin + i * BN));
      const RingSlot<Cfg::kStages> stage(tiles);
      mbar_wait(&sm.empty[stage.stage], stage.parity ^ 1);
#pragma unroll
      for (int part = 0; part < 2; ++part) {  // K, then V
        const RingSlot<Cfg::kRawSlots> slot(2 * tiles + part);
        mbar_wait(&sm.raw_full[slot.stage], slot.parity);
        const uint32_t outside = sm.raw_mask[slot.stage];
        if (part == 0) {
          if (ctid == 0) sm.stage_mask[stage.stage] = outside;  // released by warp 1's arrival on full
          convert_tile<Cfg, true>(sm.raw_tile(slot.stage), sm.raw_scales(slot.stage), sm.k(stage.stage), ctid, valid,
                                  outside, box_shift, per_tensor, k_tensor, smooth);
        } else {
          convert_tile<Cfg, false>(sm.raw_tile(slot.stage), sm.raw_scales(slot.stage), sm.v(stage.stage), ctid,
                                   valid, outside, box_shift, per_tensor, v_tensor, no_smooth);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&sm.raw_empty[slot.stage]);
      }
      wgmma::fence_proxy_async_smem();  // the tiles, visible to the tensor cores
      __syncwarp();
      if (lane == 0) mbar_arrive(&sm.full[stage.stage]);
    }
  }
}

}  // namespace sm90
}  // namespace tileinfer
