// Persistent tile scheduler of the Hopper prefill kernel: a grid of at most
// one block per SM walks the work items (row tile, sequence, head; a head is
// a KV head's group of query heads, or one query head: PrefillParams::
// item_group). The order is a function of shapes only (positions are read
// on the device); this file says why it is what it is, prefill_order.h holds
// it as arithmetic (shared with the host's plan and a CPU test), and
// next_item below takes a block's items with rows to compute.
//
// Units and rounds. The items are grouped into units of one or two items,
// numbered in the order below; block b takes unit b of round 0, unit
// 2G - 1 - b of round 1, and so on (G blocks): the rounds alternate
// direction, so a block that took one of the heaviest units of a round takes
// one of the lightest of the next, which evens out the blocks' sums of key
// tiles.
//
// The order of a prompt batch (PrefillOrder::kPairs):
//   - first, pair by pair ((sequence, head)), doubles: the unit j of a
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
// items recur once per row tile, every num_seqs * item_heads items, and
// with a stride that shares factors with the grid they land on a subset of
// the blocks (9 sequences x 8 KV heads = 72 on 132 blocks: 88 blocks took all
// of a 1k chunk's items, three rounds where two would do). Sequence by
// sequence, a chunk's items are consecutive, so they go around the blocks as
// densely as a lone prompt's.
//
// Row tiles past a sequence's queries, and a mixed step's decode sequences,
// are inactive: next_item skips them 32 at a time.
//
// A mixed step whose prefill runs beside its decodes (prefill.cu, "Mixed
// steps beside their decodes") hands its items out at run time instead:
// two launches share one counter (p.item_counter), one on most SMs from the
// start and one on the decodes' SMs once the decodes are done, so neither
// launch's share is fixed before the decodes' lengths are known. The
// counter numbers the active items only, in the mixed order above (the
// decode sequences have none), and take_item finds each number's item.
#pragma once

#include "../attention_work.cuh"
#include "prefill_order.h"
#include "prefill_tile.h"

namespace tileinfer {
namespace sm90 {

// A block's place in the run-time hand-out, in shared memory (the producer
// warp's registers are all taken by its copy loop): its numbers grow, so its
// lanes keep a window of 32 sequences with their running count of active
// items, moved forward as the numbers pass it (each block reads every
// sequence's query range at most once).
struct HandOutCursor {
  int seq0;      // the window's first sequence
  int before;    // active items of the sequences before the window
  int upto[32];  // lane l: active items of the window up to sequence seq0 + l; -1 until read
  __device__ void reset() {
    const int lane = threadIdx.x & 31;
    upto[lane] = -1;
    if (lane == 0) seq0 = before = 0;
    __syncwarp();
  }
};

struct PrefillScheduler {
  PrefillWalk walk;  // the order, as arithmetic (prefill_order.h)

  __device__ explicit PrefillScheduler(const PrefillParams& p)
      : walk(p.order, p.a.kv.num_seqs, p.item_heads, p.num_row_tiles, p.tail_pairs,
             static_cast<int>(gridDim.x), static_cast<int>(blockIdx.x)) {}

  // This block's first item from its `i`-th on that has rows to compute, with
  // `i` set to it, or an inactive item and `i` past the end. Called by whole
  // warps: the lanes look at 32 items at once. Inactive items (row tiles past
  // a sequence's queries, the decode sequences of a mixed step) are most of
  // the items of a varlen or mixed step (1 x 8k + 31 x 256: 62k of 66k); one
  // metadata round trip each would add up to tens of microseconds per block.
  // Each lane reads all of its item's metadata at once and the item is built
  // from the first taken lane's (shuffled to every lane): one global round
  // trip per call. Items grow with i, so once one is past the end, so are
  // all later ones.
  template <int kBlockM>
  __device__ WorkItem next_item(const PrefillParams& p, int& i) const {
    const int lane = threadIdx.x & 31;
    for (;; i += 32) {
      const int item = walk.item_at(i + lane);
      const bool in_range = walk.in_range(item);
      PrefillWalk::Slot pos{-1, 0, 0};
      StepMeta m{0, 0, 0, 0};
      bool take = false;
      if (in_range) {
        pos = walk.at(item);
        m = read_seq_meta<false>(p.a.kv, pos.seq);
        const QueryRange qr = clamp_query_range(m.q_begin, m.q_end, p.a.num_tokens);
        if (walk.is_double(item))
          pos.row_tile = walk.double_row_tile(ceil_div(qr.count * p.item_group, kBlockM), item);
        take = pos.row_tile >= 0 && prefill_takes(p.a, qr.count, pos.row_tile * kBlockM, p.item_group);
      }
      const unsigned hit = __ballot_sync(0xffffffffu, take);
      if (hit != 0) {
        const int src = __ffs(hit) - 1;
        i += src;
        pos = {__shfl_sync(0xffffffffu, pos.row_tile, src), __shfl_sync(0xffffffffu, pos.seq, src),
               __shfl_sync(0xffffffffu, pos.head, src)};
        m = {__shfl_sync(0xffffffffu, m.seq_len, src), __shfl_sync(0xffffffffu, m.q_begin, src),
             __shfl_sync(0xffffffffu, m.q_end, src), 0};
        return PrefillWork::make_at<kBlockM>(p.a, m, pos.seq, pos.head, pos.row_tile * kBlockM, p.item_group);
      }
      if (__ballot_sync(0xffffffffu, in_range) == 0) return WorkItem{};  // past the end: inactive
    }
  }

  // The run-time hand-out's next item for this block (p.item_counter), or an
  // inactive one once the numbers pass the last. Called by whole warps.
  template <int kBlockM>
  __device__ WorkItem take_item(const PrefillParams& p, HandOutCursor& c) const {
    const int lane = threadIdx.x & 31;
    const int heads = p.item_heads;
    int n = 0;
    if (lane == 0) n = atomicAdd(p.item_counter, 1);
    n = __shfl_sync(0xffffffffu, n, 0);
    // A sequence's row tiles: 0 if it is not prefill's; at most the launch's,
    // as in the order above (bad cu_seqlens_q can give more queries than
    // max_q_len), which keeps the numbers within the host's int32 check.
    auto row_tiles = [&](const StepMeta& m) {
      const QueryRange qr = clamp_query_range(m.q_begin, m.q_end, p.a.num_tokens);
      return prefill_takes(p.a, qr.count, 0, p.item_group)
                 ? min(ceil_div(qr.count * p.item_group, kBlockM), p.num_row_tiles)
                 : 0;
    };
    int seq0 = c.seq0, before = c.before, upto = c.upto[lane];
    for (;;) {
      if (upto < 0) {
        const int seq = seq0 + lane;
        upto = seq < p.a.kv.num_seqs ? row_tiles(read_seq_meta<false>(p.a.kv, seq)) * heads : 0;
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
          const int below = __shfl_up_sync(0xffffffffu, upto, d);
          if (lane >= d) upto += below;
        }
      }
      const int window = __shfl_sync(0xffffffffu, upto, 31);
      if (n - before < window) break;
      if (seq0 + 32 >= p.a.kv.num_seqs) return WorkItem{};  // past the last item (the cursor stays)
      before += window;
      seq0 += 32;
      upto = -1;
    }
    c.upto[lane] = upto;
    __syncwarp();  // every lane has read the cursor (above) before lane 0 moves it
    if (lane == 0) c.seq0 = seq0, c.before = before;
    __syncwarp();
    const int r = n - before;
    const int src = __ffs(__ballot_sync(0xffffffffu, upto > r)) - 1;
    const int below = __shfl_sync(0xffffffffu, upto, src > 0 ? src - 1 : 0);
    const int k = r - (src > 0 ? below : 0);  // the item within its sequence
    const int seq = seq0 + src;
    const StepMeta m = read_seq_meta<false>(p.a.kv, seq);
    return PrefillWork::make_at<kBlockM>(p.a, m, seq, k % heads, (row_tiles(m) - 1 - k / heads) * kBlockM,
                                         p.item_group);
  }
};

}  // namespace sm90
}  // namespace tileinfer
