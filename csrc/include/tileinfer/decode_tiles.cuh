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

#undef TILEINFER_DECODE_TILE

}  // namespace tileinfer
