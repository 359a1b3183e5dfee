// The tile kernel's mask (attention_kernel.cuh): which scores of a key tile
// a row does not see, set to -inf before the softmax. Only tiles that need it
// pay for it: tiles holding a skipped key (past the range, or on a page id
// outside the pool), overlapping the causal diagonal, reaching before some
// row's window, or reaching the tokens of a tree-verify step.
#pragma once

#include <climits>
#include <cstdint>

#include "attention_work.cuh"
#include "softmax.cuh"
#include "tile_smem.cuh"

namespace tileinfer {

// s[R][2j + e]: row R (row_of(R), its query at qpos[R]), key key0 + 8j +
// 2 quad + e of tile i, whose key 0 sits at tile_pos. qmin: the first query
// position of the warp's rows; tree_from: the first key a tree can hide
// (INT_MAX: none).
template <class Cfg, int kR, class RowOf>
__device__ __forceinline__ void mask_tile(float (&s)[kR][Cfg::kWarpN / 4], const AttentionParams& p,
                                          const TileSmem<Cfg>& sh, int i, int tile_pos, int key0, int quad,
                                          const int (&qpos)[kR], int qmin, int tree_from, RowOf row_of) {
  constexpr int BN = Cfg::kBlockN;
  constexpr int WN = Cfg::kWarpN;
  constexpr int kFlags = TileSmem<Cfg>::kFlags;
  const int slot = i % Cfg::kRowSlots;
  bool skipped = false;
#pragma unroll
  for (int f = 0; f < kFlags; ++f) skipped |= sh.flags[slot * kFlags + f] != 0;
  // The window's edge is tested per thread, for its last row (no register
  // stays live for it through the loop). The 128-row int8 tile, at 255
  // registers, spilled one with that test: there a window masks every tile.
  constexpr bool kEdgeTest = !(Cfg::kQuant && Cfg::kRowTiles == 2);
  const bool window_edge = kEdgeTest ? tile_pos + key0 < window_first_key(qpos[kR - 1], p.window_left)
                                     : p.window_left != INT_MAX;
  const bool tree_tile = tile_pos + key0 + WN - 1 >= tree_from;
  if (skipped || (p.causal && tile_pos + key0 + WN - 1 > qmin) || window_edge || tree_tile) {
    uint32_t tree[kR];  // the rows' tree words (all ones: no tree, or a tile before the step)
#pragma unroll
    for (int R = 0; R < kR; ++R) tree[R] = tree_tile ? sh.row_tree[row_of(R)] : ~0u;
#pragma unroll
    for (int j = 0; j < WN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = key0 + 8 * j + 2 * quad + e;
        const bool present = sh.key_rows[slot * BN + key] >= 0;
        const int kpos = tile_pos + key;
#pragma unroll
        for (int R = 0; R < kR; ++R)
          if (!present || (p.causal && kpos > qpos[R]) || kpos < window_first_key(qpos[R], p.window_left) ||
              tree_hides(tree[R], kpos, tree_from))
            s[R][2 * j + e] = kNegInf;
      }
  }
}

}  // namespace tileinfer
