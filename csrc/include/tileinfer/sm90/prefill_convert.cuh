// The two conversions of the Hopper prefill kernel over a quantized cache
// (Cfg::kQuant), which make its operands fp16 so that the products stay
// those of a bf16 / fp16 cache:
//   - keys and values: warps 1-3 of the producer warpgroup turn each raw
//     tile (the stored bytes, prefill_producer.cuh) into an fp16 operand
//     tile in the stage, exactly (quant.cuh's x8_to_half: 16 values for
//     eight conversions, two 8-byte loads and two 16-byte stores); with
//     per-vector scales, each row times its scale over the item's power of
//     two, also exactly (prefill_scale_range.cuh). A tile of the step's own
//     keys or values lands in the stage in fp16 already (prefill_own_kv.cuh),
//     and they only zero its rows past the key end. What remains of the
//     scales (k_scale, or the power of two of the keys) goes on the scores
//     in the consumers, and that of the values on the output.
//   - queries: each consumer warpgroup rounds its rows of the query tile, in
//     place, to fp16 at a per-row power of two (times the key smoothing
//     factors), the numerics of the tile kernel (attention_kernel.cuh).
#pragma once

#include <type_traits>

#include "../attention_work.cuh"
#include "../common.cuh"
#include "../quant.cuh"
#include "async.cuh"
#include "prefill_scale_range.cuh"
#include "prefill_smem.cuh"
#include "wgmma.cuh"

namespace tileinfer {
namespace sm90 {

// One raw tile ([kBlockN rows][D bytes]) -> one operand tile (the 128-byte
// swizzle of wgmma.cuh: 16-byte chunk c of row r at block c / 8, chunk
// (c % 8) ^ (r % 8)). Rows from `valid` on (past the item's key end: they
// hold anything, NaN included) and rows of boxes outside the pool (bit
// r >> box_shift of `outside`) become zeros, so that no NaN reaches P V;
// the consumers mask those keys. Per-vector scales: each row is multiplied by
// fp16 of its scale (`scales`, the raw slot's) times `factor`, the item's
// power of two; rows that become zeros take a factor of 0 (their scales
// were not copied, or hold anything).
//
// A thread converts one raw 16-byte chunk c (16 elements: one load, two
// 16-byte stores, output chunks 2c and 2c + 1) of rows row0 + k * kRowStep.
// The eight threads of a quarter warp (one shared-memory wavefront of
// 16-byte accesses) take four chunks of an even row r and four of row r + 1:
// at d 128 chunks 0-3 of one and 4-7 of the other (so their raw bytes span
// all 32 banks), at d 64 all four of each (a raw row is 64 bytes). Row r + 1
// flips bit 0 of the swizzle, so that the stores of row r fill the even
// positions of the 128-byte rows and those of row r + 1 the odd ones: no
// bank conflict, no per-thread choice of order. No branch between a batch's
// rows, so that their conversions interleave: a row past the tile (in the
// last step, for some threads) is converted and not stored. A tile whose
// rows are all keys (every tile but an item's last) takes a loop without
// the per-row zeroing, unrolled, so that only the last step tests the tile's end.
template <class Cfg>
__device__ __forceinline__ void convert_tile(const uint8_t* raw, const float* scales, float factor, uint8_t* tile,
                                             int ctid, int valid, uint32_t outside, int box_shift) {
  constexpr int D = Cfg::D;
  constexpr int BN = Cfg::kBlockN;
  constexpr int kChunks = D / 16;           // raw 16-byte chunks of a row: 8 (d 128) or 4 (d 64)
  constexpr int kQuarters = kChunks / 4;    // quarter warps per row pair
  constexpr int kRowStep = 32 * Cfg::kConverterWarps / kChunks;
  static_assert(kChunks == 4 || kChunks == 8, "d 64 or 128");
  static_assert((32 * Cfg::kConverterWarps) % (2 * kChunks) == 0, "whole row pairs per step");
  constexpr int kSteps = (BN + kRowStep - 1) / kRowStep;
  // Rows in flight per thread, their loads first: six of the 11 (d 128) or
  // all 6 (d 64) rows a thread converts per tile, within kProducerRegs.
  constexpr int kBatch = 6;
  // A thread's rows are kRowStep apart, a multiple of 4: the swizzle of
  // row0 + k * kRowStep is row0's, with bit 2 flipped for odd multiples of 4.
  static_assert(kRowStep % 4 == 0, "rows whose swizzle differs by bit 2 at most");
  static_assert(kBatch * kRowStep % 8 == 0, "every batch starts at row0's swizzle");
  const int quarter = ctid >> 3;
  const int upper = (ctid >> 2) & 1;  // row r + 1 of the quarter's pair
  const int row0 = 2 * (quarter / kQuarters) + upper;
  const int ch = 4 * ((quarter ^ upper) % kQuarters) + (ctid & 3);
  const uint8_t* src = raw + row0 * D + ch * 16;
  // Output chunks 2 ch and 2 ch + 1 of row row0, and of rows whose swizzle
  // has bit 2 flipped (odd multiples of 4 rows on).
  uint8_t* dst = tile + (ch >> 2) * BN * 128 + row0 * 128;
  const int x0 = (((2 * ch) & 7) ^ (row0 & 7)) << 4;
  uint8_t* const out[2][2] = {{dst + x0, dst + (x0 ^ 16)}, {dst + (x0 ^ 64), dst + (x0 ^ 80)}};
  const int rows_left = BN - row0;
  // Whether this thread's row row0 + off (off: a step's first row) is in
  // the tile: only the last step's can be past it.
  auto in_tile = [&](int off) { return off < kSteps * kRowStep && (off + kRowStep <= BN || off < rows_left); };
  // The rows of the kBatch steps from step b, loads first; kAll: every row
  // is a key of the item.
  auto batch = [&](auto all, int b) {
    constexpr bool kAll = decltype(all)::value;
    auto take = [&](int off) {
      const int r = row0 + off;
      return in_tile(off) && (kAll || (r < valid && ((outside >> (r >> box_shift)) & 1) == 0));
    };
    uint4 in[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int off = (b + j) * kRowStep;
      in[j] = take(off) ? *reinterpret_cast<const uint4*>(src + off * D) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int off = (b + j) * kRowStep;
      uint4 first, second;
      if constexpr (Cfg::kVectorScales) {
        // The row's factor, loaded here rather than with the row (six more
        // registers there made the converters spill).
        const HalfFactor f = HalfFactor::make(take(off) ? scales[row0 + off] * factor : 0.f);
        first = x8_to_scaled_half<typename Cfg::CacheT>(make_uint2(in[j].x, in[j].y), f);
        second = x8_to_scaled_half<typename Cfg::CacheT>(make_uint2(in[j].z, in[j].w), f);
      } else {
        x16_to_half<typename Cfg::CacheT>(in[j], first, second);
      }
      const int flip = (j * kRowStep) & 4 ? 1 : 0;  // (b * kRowStep: a multiple of 8)
      if (in_tile(off)) {
        *reinterpret_cast<uint4*>(out[flip][0] + off * 128) = first;
        *reinterpret_cast<uint4*>(out[flip][1] + off * 128) = second;
      }
    }
  };
  if (valid >= BN && outside == 0) {  // (the same in every thread)
#pragma unroll
    for (int b = 0; b < kSteps; b += kBatch) batch(std::true_type{}, b);
  } else {
#pragma unroll 1
    for (int b = 0; b < kSteps; b += kBatch) batch(std::false_type{}, b);
  }
}

// An own tile (prefill_own_kv.cuh), copied into the stage in fp16 by the
// producer: rows from `valid` on and rows of boxes outside the pool become
// zeros, as convert_tile makes them (past the key end the copy holds other
// tokens' rows, or anything). Whole 128-byte rows of each 64-column block
// (the swizzle only permutes inside them).
template <class Cfg>
__device__ __forceinline__ void clear_rows(uint8_t* tile, int ctid, int valid, uint32_t outside, int box_shift) {
  constexpr int BN = Cfg::kBlockN;
  if (valid >= BN && outside == 0) return;  // (the same in every thread)
  for (int x = ctid; x < BN * 8; x += 32 * Cfg::kConverterWarps) {
    const int r = x >> 3;
    if (r >= valid || ((outside >> (r >> box_shift)) & 1)) {
#pragma unroll
      for (int c = 0; c < Cfg::D / 64; ++c)
        *reinterpret_cast<uint4*>(tile + c * BN * 128 + x * 16) = make_uint4(0, 0, 0, 0);
    }
  }
}

// The converter warps' loop: the producer's items as it hands them to the
// consumers (the item beside each query tile, prefill_smem.cuh), so that
// they follow whichever order the producer takes, the scheduler's or the
// run-time hand-out of a mixed step beside its decodes; and its tiles in the
// same order (K_i then V_i-1), one raw slot per tile. Each warp arrives on
// the query buffer's empty barrier once it has read the item: an item with
// no key tile makes the consumers release its buffer without waiting for
// the converters, and the producer's next item there must not overwrite it
// before they have read it.
template <class Cfg>
__device__ __forceinline__ void prefill_convert(const PrefillParams& p, const PrefillSmem<Cfg>& sm) {
  constexpr int BN = Cfg::kBlockN;
  const int ctid = threadIdx.x - 32;  // warps 1-3
  const int lane = threadIdx.x & 31;
  const int box_shift = __ffs(p.box_rows) - 1;

  uint32_t tiles = 0;  // the stage ring position, as the producer's
  uint32_t raws = 0;   // the raw ring position
  ItemScales factors{1.f, 1.f};  // per-vector scales: the item's powers of two
  // Tile i of item w (keys or values) from the next raw slot into ring position `count`.
  auto convert = [&](const WorkItem& w, bool values, int i, uint32_t count) {
    const RingSlot<Cfg::kRawSlots> raw(raws++);
    const RingSlot<Cfg::kStages> slot(count);
    mbar_wait(&(values ? sm.empty_v : sm.empty_k)[slot.stage], slot.parity ^ 1);
    mbar_wait(&sm.raw_full[raw.stage], raw.parity);
    // Lane 0 reads the mask (before its own release of the slot) and hands it on.
    uint32_t outside = 0;
    if (lane == 0) outside = sm.raw_mask[raw.stage];
    outside = __shfl_sync(0xffffffffu, outside, 0);
    const bool own = outside & kOwnTile;
    outside &= ~kOwnTile;
    // Read by the consumers between their wait on full_k and their release of empty_k.
    if (!values && ctid == 0) sm.stage_mask[slot.stage] = outside;
    const int valid = min(BN, w.key_end - (w.key_begin + i * BN));
    uint8_t* tile = values ? sm.v(slot.stage) : sm.k(slot.stage);
    if (own)
      clear_rows<Cfg>(tile, ctid, valid, outside, box_shift);
    else
      convert_tile<Cfg>(sm.raw_tile(raw.stage), sm.raw_scales(raw.stage), values ? factors.v : factors.k, tile, ctid,
                        valid, outside, box_shift);
    wgmma::fence_proxy_async_smem();  // the tile, visible to the tensor cores
    // Every thread, after its own reads of the raw slot and writes of the
    // stage (prefill_smem.cuh).
    mbar_arrive(&sm.raw_empty[raw.stage]);
    mbar_arrive(&(values ? sm.full_v : sm.full_k)[slot.stage]);
  };
  for (uint32_t items = 0;; ++items) {
    // Lane 0 reads the item and hands it to its warp (as the consumers do),
    // ordered before its arrival on q_empty.
    const RingSlot<Cfg::kQBuffers> qs(items);
    mbar_wait(&sm.q_full[qs.stage], qs.parity);
    const WorkItem w = warp_broadcast(lane == 0 ? sm.item[qs.stage] : WorkItem{});
    if (lane == 0) mbar_arrive(&sm.q_empty[qs.stage]);
    if (!w.active) break;
    const int num_tiles = w.key_end > w.key_begin ? ceil_div(w.key_end - w.key_begin, BN) : 0;
    if constexpr (Cfg::kVectorScales) factors = ItemScales::make<typename Cfg::CacheT>(p, w, false);
    for (int i = 0; i < num_tiles; ++i) {
      convert(w, false, i, tiles + i);
      if (i > 0) convert(w, true, i - 1, tiles + i - 1);
    }
    if (num_tiles > 0) convert(w, true, num_tiles - 1, tiles + num_tiles - 1);
    tiles += num_tiles;
  }
}

// Quantized: the query rows r0 and r0 + 8 of the item (this thread's rows in
// the accumulator layout), in place in the query tile, as fp16 of q *
// k_smooth * 2^e, 2^e putting the row's largest |q * k_smooth| in [2^13,
// 2^14) (quant.cuh). The row's quad converts it (a quarter of its chunks
// each), so its 2^e stays in the registers that need it. Returns per row
// what its scores are multiplied by (`pre`, the score map's factor, times
// k_scale / 2^e, never negative: the rows take the sign of pre * k_scale;
// per-vector scales: the keys' power of two for k_scale) and whether
// the row held a non-finite value. The caller makes the writes visible to
// the tensor cores.
//
// This runs at every item's start, before the first S product, so its
// latency and its instructions are the item's: each thread loads both rows'
// chunks and its smoothing factors (the same columns for both rows) once,
// all in flight together, and makes each value q * k_smooth once, kept for
// both passes (the row maximum, then the scaled values). Loaded per chunk
// and pass, one at a time, this took ~13% of the consumers' time at 1 x 2k
// (int8, Nsight Compute's stall samples), mostly waiting on those loads;
// with each value made twice and checked one by one for the maximum, ~870
// of a consumer warp's 2111 instructions an item outside the key loop (fp8
// per tensor), against ~320 in this form. At this point of the item only
// these values are live (64 registers at d 128).
template <class Cfg>
__device__ __forceinline__ void convert_queries(const PrefillParams& p, uint8_t* q_tile, const WorkItem& w, int r0,
                                                int quad, float pre, float (&unscale)[2], bool (&bad)[2]) {
  using QT = typename Cfg::QT;
  constexpr int BM = Cfg::kBlockM;
  constexpr int kMine = Cfg::D / 32;  // 16-byte chunks of a row per quad lane: quad, quad + 4, ...
  const PagedKVParams& kv = p.a.kv;
  // This lane's chunk m of row r (the 128-byte swizzle of wgmma.cuh).
  auto chunk = [&](int r, int m) {
    const int c = quad + 4 * m;
    return reinterpret_cast<uint4*>(q_tile + (c >> 3) * BM * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
  };
  uint4 in[2][kMine];
#pragma unroll
  for (int R = 0; R < 2; ++R)
#pragma unroll
    for (int m = 0; m < kMine; ++m) in[R][m] = *chunk(r0 + 8 * R, m);
  // The values q * k_smooth of this lane's columns (without smoothing q
  // itself: past the head dim q is 0, as the copy engine fills it).
  float v[2][kMine][8];
#pragma unroll
  for (int R = 0; R < 2; ++R)
#pragma unroll
    for (int m = 0; m < kMine; ++m)
#pragma unroll
      for (int k = 0; k < 8; ++k) v[R][m][k] = to_float(reinterpret_cast<const QT*>(&in[R][m])[k]);
  if (kv.k_smooth != nullptr) {
    // Two 16-byte loads a chunk (the host takes this kernel only where
    // k_smooth starts 16-byte aligned, prefill.cu): one float at a time,
    // ptxas gave each of the 32 loads an address of its own (two
    // instructions each).
    const float* smooth = kv.k_smooth + static_cast<int64_t>(w.kv_head) * kv.head_dim;
#pragma unroll
    for (int m = 0; m < kMine; ++m) {
      // A chunk is inside the head dim or past it (head dims are multiples
      // of 16); one past it reads the last chunk's factors, and takes 0.
      // (With the load predicated instead, ptxas made each address anew.)
      const int col = 8 * (quad + 4 * m);
      const float4* at = reinterpret_cast<const float4*>(smooth + min(col, kv.head_dim - 8));
      const float4 lo = __ldg(at), hi = __ldg(at + 1);
      const float f[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
      for (int k = 0; k < 8; ++k)
#pragma unroll
        for (int R = 0; R < 2; ++R) v[R][m][k] *= col < kv.head_dim ? f[k] : 0.f;
    }
  }
  const float k_scale =
      Cfg::kVectorScales ? ItemScales::make<typename Cfg::CacheT>(p, w, true).k : __ldg(kv.k_scale);
#pragma unroll
  for (int R = 0; R < 2; ++R) {
    // The row's largest |value|, inf where one is not finite: as unsigned
    // integers the bits of |x| order as the floats do, and every NaN and
    // inf lies above the finite ones.
    uint32_t top = 0;
#pragma unroll
    for (int m = 0; m < kMine; ++m)
#pragma unroll
      for (int k = 0; k < 8; ++k) top = max(top, __float_as_uint(v[R][m][k]) & 0x7fffffffu);
    const float amax = warp_max<4>(top < 0x7f800000u ? __uint_as_float(top) : INFINITY);
    // A negative pre (scale < 0, uncapped) or per-tensor k_scale goes into
    // the row, so that the factor the softmax folds into its multiplier
    // stays >= 0 (folding a negative one would turn the row's maximum into
    // its minimum).
    const float qs = (pre < 0.f) != (k_scale < 0.f) ? -query_row_scale(amax) : query_row_scale(amax);
    bad[R] = isinf(amax);
    unscale[R] = pre * pow2_inverse(qs) * k_scale;
#pragma unroll
    for (int m = 0; m < kMine; ++m)
      *chunk(r0 + 8 * R, m) =
          make_uint4(pack2<__half>(v[R][m][0] * qs, v[R][m][1] * qs), pack2<__half>(v[R][m][2] * qs, v[R][m][3] * qs),
                     pack2<__half>(v[R][m][4] * qs, v[R][m][5] * qs), pack2<__half>(v[R][m][6] * qs, v[R][m][7] * qs));
  }
}

}  // namespace sm90
}  // namespace tileinfer
