// The decode kernel's tile configurations (TileConfig, tile_config.cuh),
// which csrc/ops/decode.cu picks from per launch. Their shapes, and why, are in the support table
// (tile_table.h: decode_tile_small, decode_tile_quant_wide, decode_tile_large).
#pragma once

#include <cstdint>

#include "attention_kernel.cuh"
#include "tile_table.h"

namespace tileinfer {

// A TileConfig of the table's shape S for queries of type T over a cache of type CacheT.
#define TILEINFER_DECODE_TILE(T, D, CacheT, S) \
  TileConfig<TileElement<T, CacheT>, D, S.warps_m, S.warps_n, S.row_tiles, S.block_n, S.stages, CacheT, T>

// Up to 16 packed rows (group x queries) a block; up to 32 a launch (decode.cu).
template <typename T, int D, typename CacheT = T>
using DecodeTileSmall = TILEINFER_DECODE_TILE(T, D, CacheT, decode_tile_small(D));
// A quantized (int8 or fp8) cache whose launch fits two blocks per SM (d <= 128).
template <typename T, int D, typename CacheT>
using DecodeTileQuantWide = TILEINFER_DECODE_TILE(T, D, CacheT, decode_tile_quant_wide(D));
static_assert(DecodeTileQuantWide<__nv_bfloat16, 128, int8_t>::kSmemBytes * 2 <= 227 * 1024 &&
                  DecodeTileQuantWide<__nv_bfloat16, 128, int8_t>::kSmemBytes * 3 > 227 * 1024,
              "the wide quantized decode tile is meant for two blocks per SM");
// More packed rows (verify steps with large groups).
template <typename T, int D, typename CacheT = T>
using DecodeTileLarge = TILEINFER_DECODE_TILE(T, D, CacheT, decode_tile_large(D));

// The same tiles with a deep ring of stages, for blocks with an SM each (16-bit caches).
template <typename T, int D>
using DecodeTileSmallDeep = TILEINFER_DECODE_TILE(T, D, T, decode_tile_small_deep(D));
template <typename T, int D>
using DecodeTileLargeDeep = TILEINFER_DECODE_TILE(T, D, T, decode_tile_large_deep(D));
// The shared memory a block of a deep tile may take: Hopper's 227 KB (a
// device attribute the launch checks, decode.cu).
constexpr int kDecodeDeepSmemBytes = 227 * 1024;
template <class Cfg>
constexpr bool fits_deep_smem = Cfg::kSmemBytes + Cfg::kSplitMergeBytes <= kDecodeDeepSmemBytes;
template <int D>
constexpr bool deep_tiles_fit =
    fits_deep_smem<DecodeTileSmallDeep<__nv_bfloat16, D>> && fits_deep_smem<DecodeTileLargeDeep<__nv_bfloat16, D>>;
static_assert(deep_tiles_fit<64> && deep_tiles_fit<128> && deep_tiles_fit<256>,
              "a deep decode tile fits its SM's shared memory");

#undef TILEINFER_DECODE_TILE

}  // namespace tileinfer
