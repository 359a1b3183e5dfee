// The shape of the mma.sync attention kernel's tile (attention_kernel.cuh):
// warps, rows, keys per tile, stages, and what follows from them (registers
// kept, shared-memory layout, swizzles). decode_tiles.cuh and prefill.cu pick
// instances of it; tile_table.h lists the shapes per head dim.
#pragma once

#include <type_traits>

#include "quant.cuh"

namespace tileinfer {

// kRowTiles: 16-row mma tiles per warp. Two (32 rows) halve the shared-memory
// traffic per mma: every K / V fragment read by ldmatrix feeds both row tiles
// (with one, ldmatrix bandwidth, not the tensor cores, bounds prefill).
// T: the tensor cores' element type; CacheT: the pools' (T, or a quantized
// type: int8_t, __nv_fp8_e4m3); QT: the queries' (T, or bf16 / fp16 with a
// quantized cache, where T is fp16).
template <typename T_, int kHeadDim, int kWarpsM_, int kWarpsN_, int kRowTiles_, int kBlockN_, int kStages_,
          typename CacheT_ = T_, typename QT_ = T_>
struct TileConfig {
  using T = T_;
  using CacheT = CacheT_;
  using QT = QT_;
  static constexpr bool kQuant = kQuantized<CacheT>;           // int8 or fp8, with fp32 scales
  static constexpr bool kInt8 = std::is_same_v<CacheT, int8_t>;  // scores on the integer tensor cores
  static constexpr bool kFp8 = kQuant && !kInt8;                  // keys converted to fp16 for the scores
  static constexpr int D = kHeadDim;
  static constexpr int kWarpsM = kWarpsM_;
  static constexpr int kWarpsN = kWarpsN_;
  static constexpr int kRowTiles = kRowTiles_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kWarpRows = 16 * kRowTiles;
  static constexpr int kBlockM = kWarpRows * kWarpsM;
  static constexpr int kWarpN = kBlockN / kWarpsN;  // keys of a tile per warp
  static constexpr int kChunks = D / 8;             // 16-byte chunks per row of D elements
  static constexpr int kRowBytes = D * static_cast<int>(sizeof(CacheT));  // one cached key / value row
  static constexpr int kCacheChunks = kRowBytes / 16;
  // Q fragments stay in registers up to 32 registers (d = 128, one row tile);
  // beyond, next to the output accumulator, they would push the kernel past 255
  // registers, so they are re-read from shared memory (ldmatrix) per tile.
  static constexpr bool kQInRegs = D * kRowTiles <= 128;
  static constexpr int kOStride = D + 8;  // fp32 epilogue rows: +8 floats avoids bank conflicts
  static constexpr int kRowSlots = kStages + 1;  // key-row lookups run one tile ahead of the copies
  // Warps split each key tile (decode: the packed rows fit one row tile):
  // a stream over the cache, whose copies take the page-run path
  // (KeyTiles::copy_kv) and whose epilogue skips rows of no query.
  static constexpr bool kKeySlices = kWarpsN > 1;

  static_assert(kThreads == 128, "the kernels are written for 4 warps");
  static_assert(kWarpsM == 1 || kWarpsN == 1, "warps split either rows or keys (conversion barriers)");
  static_assert(kWarpN % 16 == 0, "each warp needs whole 16-key slices (PV k-dimension)");
  static_assert(kBlockN % 32 == 0 && kBlockN <= kThreads, "one lookup thread per key, whole warps");
  static_assert((kBlockN * kCacheChunks) % kThreads == 0, "whole copy rounds per tile");
  static_assert(std::is_same_v<CacheT, T> || kQuant, "cache: the element type or a quantized type");
  static_assert(kQuant ? std::is_same_v<T, __half> : std::is_same_v<QT, T>, "quantized: fp16 math; else q is T");
  static_assert(!kQuant || (kWarpN * kCacheChunks) % (32 * kWarpsM) == 0, "whole conversion rounds per key slice");
  static_assert(!kQuant || (D % 32 == 0 && 32 % kChunks == 0), "quantized: k32 steps; a query row's chunks in one warp");
  static_assert(kStages >= 2, "at least double buffering");

  // Shared memory, in bytes. The K/V stages (and the int8 cache's converted
  // tile) are dead once the last tile is done; the epilogue's fp32 output
  // buffer reuses them.
  static constexpr int kTileBytes = kBlockN * kRowBytes;  // one staged K or V tile
  static constexpr int kKVBytes = kStages * 2 * kTileBytes;
  // int8: values go from the staged tile into fp16 fragments in registers when
  // each warp reads a key slice of its own (kWarpsM == 1, decode); when all
  // warps read the whole tile (prefill), they convert it once, together, into
  // this shared fp16 tile. (The keys are always used as they are.)
  static constexpr bool kValuesInRegs = kQuant && kWarpsM == 1;
  static constexpr int kConvBytes = kQuant && !kValuesInRegs ? kBlockN * D * 2 : 0;
  static constexpr int kOBytes = kWarpsN * kBlockM * kOStride * 4;
  static constexpr int kMainBytes = kKVBytes + kConvBytes > kOBytes ? kKVBytes + kConvBytes : kOBytes;
  static constexpr int kQBytes = kBlockM * D * 2;  // int8: the hi and the lo plane, D bytes per row each; fp8: fp16
  static constexpr int kIntBytes = ((kRowSlots * kBlockN          // key rows
                                     + kStages * kBlockN           // their block-table entries
                                     + kRowSlots * (kBlockN / 32)  // "tile has skipped keys" flags
                                     + 4 * kBlockM                 // row token / head / position / tree word
                                     + (kQuant ? kBlockM : 0))     // quantized: each row's max |q * smooth|
                                        * 4 +
                                    15) / 16 * 16;                 // the floats after it take float2 loads
  static constexpr int kFloatBytes = (2 * kWarpsN * kBlockM + kBlockM      // merge (m, l), lse
                                     + (kQuant ? kStages * 2 * kBlockN : 0))  // quantized: key / value scales
                                    * 4;
  static constexpr int kSmemBytes = kMainBytes + kQBytes + kIntBytes + kFloatBytes;
  // Past kSmemBytes, in the walking decode kernels of the key-slice tile at
  // d <= 128 (attention_host.h adds it to their launches without partials):
  // each row's running merge of its splits, for a block that merges them
  // itself (split_merge.cuh): acc [kBlockM][D], then max and den [kBlockM]. The
  // 64-row tile (verify steps of large groups) never does: it would lose its
  // second block per SM; nor does d 256, at 255 registers, whose key loop
  // spilled with the merge's code beside it.
  static constexpr bool kMergesSplits = kKeySlices && D <= 128;
  static constexpr int kSplitMergeBytes = kMergesSplits ? (kBlockM * D + 2 * kBlockM) * 4 : 0;
  static_assert(kSmemBytes % 16 == 0, "the merge's rows past kSmemBytes take float4 accesses");
  // Blocks per SM the register allocation must allow: the int8 decode loop is
  // instruction-bound, and a third block (where shared memory fits it) gives the
  // schedulers more warps to choose from. Others: whatever the registers allow.
  static constexpr int kSmemPerSM = 227 * 1024;
  static constexpr int kMinBlocks =
      kQuant && kWarpsM == 1 ? (kSmemPerSM / (kSmemBytes + 1024) < 3 ? 1 : 3) : 1;

  // Element offset of 16-byte chunk `ch` of row `row` in a [rows, D] tile. The
  // chunk index is XORed with row % 8, so the 8 rows an ldmatrix phase reads
  // (same logical chunk) land in 8 different bank groups, and cp.async writes
  // whole rows contiguously either way.
  __device__ static __forceinline__ int swz(int row, int ch) { return row * D + ((ch ^ (row & 7)) << 3); }
  // The same for the staged cache rows, in bytes: identical to swz for a T
  // cache; int8 rows of 64 elements have only 4 chunks to permute.
  static constexpr int kStageSwizzle = (kCacheChunks < 8 ? kCacheChunks : 8) - 1;
  __device__ static __forceinline__ int stage_offset(int row, int ch) {
    return row * kRowBytes + ((ch ^ (row & kStageSwizzle)) << 4);
  }
};

// The tensor cores' element type for queries of type QT over a CacheT cache.
template <typename QT, typename CacheT>
using TileElement = std::conditional_t<kQuantized<CacheT>, __half, QT>;

// Column offsets (elements) of chunks 2m + b, m = 0, 1, ..., in swizzled rows
// with row % 8 == x. Every ldmatrix row address of the kernel has row % 8 ==
// lane % 8, and (2m + b) ^ x = 8 (m / 4) + ((2 (m % 4) + b) ^ x): four values per
// thread plus compile-time constants in the unrolled loops, instead of one
// register per m (which spilled next to the 128-row tile's accumulators).
struct SwizzleCols {
  int v[4];
  __device__ __forceinline__ SwizzleCols(int b, int x) {
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = ((2 * u + b) ^ x) << 3;
  }
  __device__ __forceinline__ int operator()(int m) const { return (m >> 2) * 64 + v[m & 3]; }
};

}  // namespace tileinfer
