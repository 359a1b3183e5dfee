// The order in which the Hopper prefill kernel's persistent grid walks its
// work items (prefill_scheduler.cuh says why this order), as arithmetic on
// shapes and a block's place in the grid. Host and device code: the host
// plans the order, tail and grid with it (prefill.cu), each block walks it
// (prefill_scheduler.cuh), and a CPU test walks every block of random
// batches with it (tests/test_prefill_order.py). No CUDA header: a plain C++
// compiler takes this file.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace tileinfer {
namespace sm90 {

enum class PrefillOrder : int {
  kPairs,      // prompts: pair by pair two row tiles at a time, then a tail heaviest first
  kSequences,  // mixed steps: sequence by sequence, each one's row tiles heaviest first
};

// What the host chooses from shapes: the order, the tail, the units and the
// grid (at most one block per SM).
struct PrefillPlan {
  PrefillOrder order;
  int tail_pairs;  // kPairs: the last pairs, taken item by item
  int64_t units;
  int grid;        // min(units, SMs)
};

// About three rounds of single items end a prompt batch; one whose keys and
// values fit in half the L2 (`fits_l2`, the caller's estimate) is all tail.
inline PrefillPlan plan_prefill_order(int64_t num_seqs, int64_t heads, int64_t num_row_tiles, bool mixed,
                                      bool fits_l2, int64_t sms) {
  constexpr int64_t kTailRounds = 3;
  const int64_t pairs = num_seqs * heads;
  PrefillPlan plan{PrefillOrder::kSequences, 0, pairs * num_row_tiles, 0};
  if (!mixed) {
    int64_t tail = fits_l2 ? pairs : (kTailRounds * sms + num_row_tiles - 1) / num_row_tiles;
    if (tail > pairs) tail = pairs;
    const int64_t units = (pairs - tail) * ((num_row_tiles + 1) / 2) + tail * num_row_tiles;
    plan = {PrefillOrder::kPairs, static_cast<int>(tail), units, 0};
  }
  plan.grid = static_cast<int>(plan.units < sms ? plan.units : sms);
  return plan;
}

// One block's walk. Its items are numbered 2 * unit + half (the second item
// of a double has half 1); item_at(i) grows with i.
struct PrefillWalk {
  struct Slot {
    int row_tile;  // -1 for a double's: double_row_tile, from the sequence's queries
    int seq, head;  // the item's heads: a KV head's group, or one query head (PrefillParams::item_group)
  };

  PrefillOrder order;
  int heads, num_row_tiles, tail_pairs, grid, block;
  int pairs;         // (sequence, head) pairs
  int doubles;       // units per pair before the tail, ceil(num_row_tiles / 2)
  int double_units;  // (pairs - tail_pairs) * doubles
  int num_units;
  int last_double_round;  // this block's round past its last double

  TILEINFER_HD PrefillWalk(PrefillOrder order_, int num_seqs, int heads_, int num_row_tiles_, int tail_pairs_,
                           int grid_, int block_)
      : order(order_), heads(heads_), num_row_tiles(num_row_tiles_), tail_pairs(tail_pairs_), grid(grid_),
        block(block_), pairs(num_seqs * heads_), doubles((num_row_tiles_ + 1) / 2) {
    const bool by_pairs = order == PrefillOrder::kPairs;
    double_units = by_pairs ? (pairs - tail_pairs) * doubles : 0;
    num_units = by_pairs ? double_units + tail_pairs * num_row_tiles : pairs * num_row_tiles;
    const int full = double_units / grid;  // rounds of doubles only
    last_double_round = full + (position(full) < double_units - full * grid ? 1 : 0);
  }

  // Item i of this block.
  TILEINFER_HD int item_at(int i) const {
    if (i < 2 * last_double_round) return 2 * unit_at(i >> 1) + (i & 1);
    return 2 * unit_at(last_double_round + i - 2 * last_double_round);
  }
  TILEINFER_HD bool in_range(int item) const { return (item >> 1) < num_units; }
  TILEINFER_HD bool is_double(int item) const { return (item >> 1) < double_units; }

  // The sequence and head of an item, and its row tile unless it is a double's.
  TILEINFER_HD Slot at(int item) const {
    const int unit = item >> 1;
    if (order == PrefillOrder::kSequences) {
      const int per_seq = num_row_tiles * heads;
      const int rest = unit % per_seq;
      return {num_row_tiles - 1 - rest / heads, unit / per_seq, rest % heads};
    }
    if (unit < double_units) {
      const int pair = unit / doubles;
      return {-1, pair / heads, pair % heads};
    }
    const int t = unit - double_units;  // the tail, row tile major
    const int pair = pairs - tail_pairs + t % tail_pairs;
    return {num_row_tiles - 1 - t / tail_pairs, pair / heads, pair % heads};
  }

  // A double's item: row tile R - 1 - j (half 0) or j (half 1) of the
  // sequence's own R row tiles, j = (unit + pair) % doubles (each pair's
  // units rotated by the pair); -1 where there is none (j past the middle, or
  // the middle tile of an odd R as half 1).
  TILEINFER_HD int double_row_tile(int own_row_tiles, int item) const {
    const int unit = item >> 1;
    const int j = (unit + unit / doubles) % doubles;
    const int heavy = own_row_tiles - 1 - j;
    if (heavy < j) return -1;
    if (item & 1) return heavy > j ? j : -1;
    return heavy;
  }

 private:
  // Where this block sits in round r: its unit is r * grid + position(r).
  TILEINFER_HD int position(int r) const { return r % 2 == 0 ? block : grid - 1 - block; }
  TILEINFER_HD int unit_at(int r) const { return r * grid + position(r); }
};

}  // namespace sm90
}  // namespace tileinfer
