// Persistent tile scheduler of the Hopper prefill kernel: a grid of at most
// one block per SM walks the work items (row tile, sequence, KV head). The
// order is a function of shapes only (positions are read on the device).
//
// Units and rounds. The items are grouped into units of one or two items,
// numbered in the order below; block b takes unit b of round 0, unit
// 2G - 1 - b of round 1, and so on (G blocks): the rounds alternate
// direction, so a block that took one of the heaviest units of a round takes
// one of the lightest of the next, which evens out the blocks' sums of key
// tiles.
//
// The order of a prompt batch (PrefillOrder::kPairs):
//   - first, pair by pair ((sequence, KV head)), doubles: the unit j of a
//     pair is its row tiles R - 1 - j and j (R: the sequence's row tiles),
//     whose key tiles add up to about the same for every j under causal
//     masking. A round touches the pages of a few pairs, and the second item
//     of a double reads a subset of the first's keys, so the pages come from
//     L2. (Row tile major over all pairs, the heaviest first, every round
//     touched every pair's pages and read most of them from memory again
//     once the batch's keys and values outgrew L2: 16 prompts of 1k tokens,
//     L2 hit rate 44%, 82% pair by pair, 11% faster.) Every pair has J units
//     (from max_q_len), taken from j = pair mod J on and wrapping around: a
//     short sequence's active units are its first j's, and at the same place
//     in every pair they fell on the few blocks that the stride J reaches
//     modulo the grid (1 x 2048 queries + 64 single ones at 4k positions,
//     J = 32 on 132 blocks: the 64 single queries' items all on 33 blocks,
//     the launch 1.9x slower).
//   - then the last `tail_pairs` pairs item by item, row tile major, the
//     heaviest first (the last row tiles, whose queries see the most keys),
//     about three rounds of them: the launch ends on the lightest items, and
//     the blocks that took no double in the round where the doubles end take
//     the heaviest of these. A batch with fewer items than that is all tail,
//     and so is one whose keys and values fit in half the L2 (prefill.cu).
//
// A mixed step (PrefillOrder::kSequences, p.a.mixed_queries > 0: the
// attention op) takes single items sequence by sequence (each sequence's row
// tiles heaviest first, its heads next to each other). Its active items are a
// few prompt chunks among many decode sequences; in row-tile order a chunk's
// items recur once per row tile, every num_seqs * num_kv_heads items, and
// with a stride that shares factors with the grid they land on a subset of
// the blocks (9 sequences x 8 KV heads = 72 on 132 blocks: 88 blocks took all
// of a 1k chunk's items, three rounds where two would do). Sequence by
// sequence, a chunk's items are consecutive, so they go around the blocks as
// densely as a lone prompt's.
//
// Row tiles past a sequence's queries, and a mixed step's decode sequences,
// are inactive: next_item skips them 32 at a time.
#pragma once

#include "../attention_work.cuh"
#include "prefill_tile.h"

namespace tileinfer {
namespace sm90 {

struct PrefillScheduler {
  int pairs;         // (sequence, KV head) pairs
  int doubles;       // doubles per pair, ceil(num_row_tiles / 2)
  int double_units;  // doubles before the tail: (pairs - tail_pairs) * doubles
  int num_units;
  int last_double_round;  // this block's round past its last double

  __device__ explicit PrefillScheduler(const PrefillParams& p)
      : pairs(p.a.kv.num_seqs * p.a.kv.num_kv_heads), doubles((p.num_row_tiles + 1) / 2) {
    const bool by_pairs = p.order == PrefillOrder::kPairs;
    double_units = by_pairs ? (pairs - p.tail_pairs) * doubles : 0;
    num_units = by_pairs ? double_units + p.tail_pairs * p.num_row_tiles : pairs * p.num_row_tiles;
    const int full = double_units / gridDim.x;  // rounds of doubles only
    last_double_round = full + (position(full) < double_units - full * static_cast<int>(gridDim.x) ? 1 : 0);
  }

  // Item i of this block (i = 0, 1, ...) as 2 * unit + half (the second item
  // of a double has half 1). Items grow with i, so once one is past the end,
  // so are all later ones.
  __device__ int item_at(int i) const {
    if (i < 2 * last_double_round) return 2 * unit_at(i >> 1) + (i & 1);
    return 2 * unit_at(last_double_round + i - 2 * last_double_round);
  }

  // This block's first item from its `i`-th on that has rows to compute, with
  // `i` set to it, or an inactive item and `i` past the end. Called by whole
  // warps: the lanes look at 32 items at once. Inactive items (row tiles past
  // a sequence's queries, the decode sequences of a mixed step) are most of
  // the items of a varlen or mixed step (1 x 8k + 31 x 256: 62k of 66k); one
  // metadata round trip each would add up to tens of microseconds per block.
  // Each lane reads all of its item's metadata at once and the item is built
  // from the first taken lane's (shuffled to every lane): one global round
  // trip per call.
  template <int kBlockM>
  __device__ WorkItem next_item(const PrefillParams& p, int& i) const {
    const int lane = threadIdx.x & 31;
    for (;; i += 32) {
      const int item = item_at(i + lane);
      const bool in_range = (item >> 1) < num_units;
      Pos pos{-1, 0, 0};
      StepMeta m{0, 0, 0, 0};
      bool take = false;
      if (in_range) {
        pos = at(p, item >> 1);
        m = read_seq_meta<false>(p.a.kv, pos.seq);
        const QueryRange qr = clamp_query_range(m.q_begin, m.q_end, p.a.num_tokens);
        if ((item >> 1) < double_units) pos.row_tile = double_row_tile<kBlockM>(p, qr.count, item);
        take = pos.row_tile >= 0 && prefill_takes(p.a, qr.count, pos.row_tile * kBlockM);
      }
      const unsigned hit = __ballot_sync(0xffffffffu, take);
      if (hit != 0) {
        const int src = __ffs(hit) - 1;
        i += src;
        pos = {__shfl_sync(0xffffffffu, pos.row_tile, src), __shfl_sync(0xffffffffu, pos.seq, src),
               __shfl_sync(0xffffffffu, pos.kv_head, src)};
        m = {__shfl_sync(0xffffffffu, m.seq_len, src), __shfl_sync(0xffffffffu, m.q_begin, src),
             __shfl_sync(0xffffffffu, m.q_end, src), 0};
        return PrefillWork::make_at<kBlockM>(p.a, m, pos.seq, pos.kv_head, pos.row_tile * kBlockM);
      }
      if (__ballot_sync(0xffffffffu, in_range) == 0) return WorkItem{};  // past the end: inactive
    }
  }

 private:
  struct Pos {
    int row_tile, seq, kv_head;
  };
  // Where this block sits in round r (its unit is r * G + position(r)).
  __device__ int position(int r) const {
    return r % 2 == 0 ? static_cast<int>(blockIdx.x) : static_cast<int>(gridDim.x - 1 - blockIdx.x);
  }
  __device__ int unit_at(int r) const { return r * static_cast<int>(gridDim.x) + position(r); }

  // The sequence and head of a unit, and the row tile of a single item (a
  // double's row tiles depend on the sequence's queries: double_row_tile).
  __device__ Pos at(const PrefillParams& p, int unit) const {
    const int heads = p.a.kv.num_kv_heads;
    if (p.order == PrefillOrder::kSequences) {
      const int per_seq = p.num_row_tiles * heads;
      const int rest = unit % per_seq;
      return {p.num_row_tiles - 1 - rest / heads, unit / per_seq, rest % heads};
    }
    if (unit < double_units) {
      const int pair = unit / doubles;
      return {-1, pair / heads, pair % heads};
    }
    const int t = unit - double_units;  // the tail, row tile major
    const int pair = pairs - p.tail_pairs + t % p.tail_pairs;
    return {p.num_row_tiles - 1 - t / p.tail_pairs, pair / heads, pair % heads};
  }
  // Item 2 * unit + half of a double: row tile R - 1 - j (half 0) or j (half
  // 1) of the sequence's own R row tiles, j = (unit + pair) % doubles (the
  // pair's units rotated by the pair); -1 where there is none (j past the
  // middle, or the middle tile of an odd R as half 1).
  template <int kBlockM>
  __device__ int double_row_tile(const PrefillParams& p, int q_count, int item) const {
    const int R = ceil_div(q_count * p.a.group_size, kBlockM);
    const int unit = item >> 1;
    const int j = (unit + unit / doubles) % doubles;
    const int heavy = R - 1 - j;
    if (heavy < j) return -1;
    if (item & 1) return heavy > j ? j : -1;
    return heavy;
  }
};

}  // namespace sm90
}  // namespace tileinfer
