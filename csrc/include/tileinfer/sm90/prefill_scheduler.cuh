// Persistent tile scheduler of the Hopper prefill kernel: a grid of at most
// one block per SM walks the work items (row tile, sequence, KV head) in
// rounds of one item per block. Items are numbered heaviest first: the last
// row tiles (the latest queries, which see the most keys under causal
// masking) of every sequence and head come first, so the short items fill the
// end of the launch. The rounds alternate direction (block b takes item b of
// even rounds and item G - 1 - b of odd ones, G blocks): under causal masking
// a block that took one of the heaviest items of a round takes one of the
// lightest of the next, which evens out the blocks' sums of key tiles (with
// the same direction every round, block 0 would take the heaviest item of
// every round). Row tiles past a sequence's queries, and a mixed step's decode
// sequences, are inactive: next_active skips them 32 rounds at a time. The
// order is a function of shapes only; positions are read on the device.
//
// A mixed step (p.a.mixed_queries > 0: the attention op) numbers its items
// sequence by sequence instead (each sequence's row tiles heaviest first).
// Its active items are a few prompt chunks among many decode sequences; in
// row-tile order a chunk's items recur once per row tile, every
// num_seqs * num_kv_heads items, and with a stride that shares factors with
// the grid they land on a subset of the blocks (9 sequences x 8 KV heads =
// 72 on 132 blocks: 88 blocks took all of a 1k chunk's items, three rounds
// where two would do). Sequence by sequence, a chunk's items are consecutive,
// so they go around the blocks as densely as a lone prompt's.
#pragma once

#include "../attention_work.cuh"
#include "prefill_tile.h"

namespace tileinfer {
namespace sm90 {

struct PrefillScheduler {
  int num_items;
  int per_row_tile;  // items of one row tile: num_seqs * num_kv_heads

  __device__ explicit PrefillScheduler(const PrefillParams& p)
      : num_items(p.num_row_tiles * p.a.kv.num_seqs * p.a.kv.num_kv_heads),
        per_row_tile(p.a.kv.num_seqs * p.a.kv.num_kv_heads) {}

  // This block's item of round r; items grow with r, so once one is past
  // the end, so are all later ones.
  __device__ int item_at(int round) const {
    return round * gridDim.x + (round % 2 == 0 ? blockIdx.x : gridDim.x - 1 - blockIdx.x);
  }
  __device__ bool valid(int round) const { return item_at(round) < num_items; }

  // The first round from `round` on whose item has rows to compute, or a
  // round past the end. Called by whole warps: the lanes look at 32 rounds at
  // once. Inactive items (row tiles past a sequence's queries, the decode
  // sequences of a mixed step) are most of the items of a varlen or mixed
  // step (1 x 8k + 31 x 256: 62k of 66k); one metadata round trip each
  // would add up to tens of microseconds per block.
  template <int kBlockM>
  __device__ int next_active(const PrefillParams& p, int round) const {
    const int lane = threadIdx.x & 31;
    for (;; round += 32) {
      const int item = item_at(round + lane);
      bool take = false;
      if (item < num_items) {
        const Pos pos = at(p, item);
        const QueryRange qr =
            clamp_query_range(p.a.kv.cu_seqlens_q[pos.seq], p.a.kv.cu_seqlens_q[pos.seq + 1], p.a.num_tokens);
        take = prefill_takes(p.a, qr.count, pos.row_tile * kBlockM);
      }
      const unsigned hit = __ballot_sync(0xffffffffu, take);
      if (hit != 0) return round + __ffs(hit) - 1;
      if (__ballot_sync(0xffffffffu, item < num_items) == 0) return round;  // past the end
    }
  }

  template <int kBlockM>
  __device__ WorkItem make(const PrefillParams& p, int round) const {
    const Pos pos = at(p, item_at(round));
    return PrefillWork::make_at<kBlockM>(p.a, read_seq_meta<false>(p.a.kv, pos.seq), pos.seq, pos.kv_head,
                                         pos.row_tile * kBlockM);
  }

 private:
  struct Pos {
    int row_tile, seq, kv_head;
  };
  __device__ Pos at(const PrefillParams& p, int item) const {
    const int heads = p.a.kv.num_kv_heads;
    if (p.a.mixed_queries > 0) {  // sequence by sequence
      const int per_seq = p.num_row_tiles * heads;
      const int rest = item % per_seq;
      return {p.num_row_tiles - 1 - rest / heads, item / per_seq, rest % heads};
    }
    const int rest = item % per_row_tile;
    return {p.num_row_tiles - 1 - item / per_row_tile, rest / heads, rest % heads};
  }
};

}  // namespace sm90
}  // namespace tileinfer
