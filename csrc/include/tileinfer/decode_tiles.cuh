// The decode kernel's tile shapes (TileConfig, attention_kernel.cuh), which
// csrc/ops/decode.cu picks from per launch; scripts/decode_timeline.cu times
// the same ones.
#pragma once

#include <cstdint>

#include "attention_kernel.cuh"

namespace tileinfer {

// Up to 16 packed rows (group x queries: plain decode of any group <= 16, or
// a few verify queries): one 16-row tile, and the 4 warps split each 64-key tile
// into 16-key slices, merged at the end. Decode is a stream over the cache, so
// three stages keep two tiles of copies in flight per block (d = 128: 100 KB,
// two blocks per SM); d = 256 keeps two stages to fit.
// An int8 cache's stages are half the bytes: with three of them, three blocks
// share an SM at d <= 128 (~72 KB each), for launches of more blocks than fit
// two per SM (the splits are sized for two, the wide tile below).
template <typename T, int D, typename CacheT = T>
using DecodeTileSmall = TileConfig<TileElement<T, CacheT>, D, 1, 4, 1, 64, (D == 256 ? 2 : 3), CacheT, T>;
// The same with 128-key tiles: two blocks per SM, but each warp converts and
// multiplies 32 keys per barrier, per softmax step and per scale load instead
// of 16. launch_decode picks it when the launch's blocks fit two per SM anyway;
// on the H200 (2026-11-29, two stages) it took one sequence at 32k positions
// from 36.6 to 33.6 us and 32 x 4k from 111.1 to 100.3 us, while 8 x 32k, whose
// 384 narrow blocks fill three per SM, went from 186.4 to 194.6 us with it
// (and one sequence at 1k positions, whose splits hold one 64-key page each,
// from 10.4 to 11.3 us: half of each 128-key tile is empty there). Three
// stages since the values stopped going through a converted shared tile (its
// 32 KB now hold a third stage; two blocks per SM either way); with them, 8 x
// 32k is faster with this tile and 4 splits than with 6 narrow ones, and the
// split rule (decode_splits.h) now sizes int8 splits for two blocks per SM.
template <typename T, int D>
using DecodeTileInt8Wide = TileConfig<TileElement<T, int8_t>, D, 1, 4, 1, 128, 3, int8_t, T>;
static_assert(DecodeTileInt8Wide<__nv_bfloat16, 128>::kSmemBytes * 2 <= 227 * 1024 &&
                  DecodeTileInt8Wide<__nv_bfloat16, 128>::kSmemBytes * 3 > 227 * 1024,
              "the wide int8 decode tile is meant for two blocks per SM");
// More packed rows (verify steps with large groups): 64-row tiles as prefill;
// the grid adds a row-tile dimension and row tiles share the pages through L2.
template <typename T, int D, typename CacheT = T>
using DecodeTileLarge = TileConfig<TileElement<T, CacheT>, D, 4, 1, 1, (D == 256 ? 32 : 64), 2, CacheT, T>;

}  // namespace tileinfer
