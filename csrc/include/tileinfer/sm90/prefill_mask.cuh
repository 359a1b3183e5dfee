// Masks of the Hopper prefill kernel. A key of a tile is hidden from a row
// when it is at or past the item's key end, on a page outside the pool,
// (causal) after the row's query, or before the row's window
// (window_first_key, attention_work.cuh). Only tiles that hold such a key for
// some row of the warpgroup pay for the per-score test: the tail tile, tiles
// with a bad page, tiles on the causal diagonal and on the window's edge
// (prefill_masked_tiles.h says which).
#pragma once

#include <climits>

#include "../attention_work.cuh"
#include "../softmax.cuh"
#include "prefill_masked_tiles.h"

namespace tileinfer {
namespace sm90 {

struct TileMask {
  int tile_pos;      // position of the tile's key 0
  int key_end;       // the item's key end
  uint32_t outside;  // bit b: box b is on a page outside the pool
  int box_shift;     // log2(keys per box)
  int window_left;   // AttentionParams::window_left (INT_MAX: no window)
  bool causal;

  // s[R][2 j + e]: row R (query position qpos[R]), key 8 j + 2 quad + e.
  // Branch-free: each row's last and first visible positions once, then
  // (the general tile) two compares and a select per score (the tests
  // written as one short-circuit chain per score compiled to a branch each).
  template <int kBlockN>
  __device__ __forceinline__ void apply(float (&s)[2][kBlockN / 4], const int (&qpos)[2], int quad) const {
    int last[2];  // key_end >= 1: the tile exists
#pragma unroll
    for (int R = 0; R < 2; ++R) last[R] = causal ? min(key_end - 1, qpos[R]) : key_end - 1;
    if (outside == 0 && window_left == INT_MAX) {
      // The common tile (no bad page, no window): only the key end and the
      // diagonal hide keys, so a score's test is its column against the
      // row's last visible column, one compare and one select. A row that
      // sees none of the tile gets a negative one (all hidden); no overflow,
      // as last >= tile_pos - 1 after the max.
      int last_col[2];
#pragma unroll
      for (int R = 0; R < 2; ++R) last_col[R] = max(last[R], tile_pos - 1) - tile_pos - 2 * quad;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
#pragma unroll
          for (int R = 0; R < 2; ++R) s[R][2 * j + e] = 8 * j + e > last_col[R] ? kNegInf : s[R][2 * j + e];
      return;
    }
    int first[2];
#pragma unroll
    for (int R = 0; R < 2; ++R) first[R] = window_first_key(qpos[R], window_left);
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = 8 * j + 2 * quad + e;
        const int kpos = tile_pos + key;
        const bool boxed_out = (outside >> (key >> box_shift)) & 1u;
#pragma unroll
        for (int R = 0; R < 2; ++R)
          s[R][2 * j + e] = (boxed_out | (kpos > last[R]) | (kpos < first[R])) ? kNegInf : s[R][2 * j + e];
      }
  }
};

}  // namespace sm90
}  // namespace tileinfer
