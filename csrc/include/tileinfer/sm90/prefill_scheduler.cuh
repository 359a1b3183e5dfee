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
// sequences, are inactive: next_item skips them 32 rounds at a time. The
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

  // The first item from round `round` on that has rows to compute, and its
  // round (`round` is set to it), or an inactive item and a round past the
  // end. Called by whole warps: the lanes look at 32 rounds at once.
  // Inactive items (row tiles past a sequence's queries, the decode
  // sequences of a mixed step) are most of the items of a varlen or mixed
  // step (1 x 8k + 31 x 256: 62k of 66k); one metadata round trip each
  // would add up to tens of microseconds per block. Each lane reads all of
  // its item's metadata at once and the item is built from the first taken
  // lane's (shuffled to every lane): one global round trip per call.
  template <int kBlockM>
  __device__ WorkItem next_item(const PrefillParams& p, int& round) const {
    const int lane = threadIdx.x & 31;
    for (;; round += 32) {
      const int item = item_at(round + lane);
      Pos pos{0, 0, 0};
      StepMeta m{0, 0, 0, 0};
      bool take = false;
      if (item < num_items) {
        pos = at(p, item);
        m = read_seq_meta<false>(p.a.kv, pos.seq);
        const QueryRange qr = clamp_query_range(m.q_begin, m.q_end, p.a.num_tokens);
        take = prefill_takes(p.a, qr.count, pos.row_tile * kBlockM);
      }
      const unsigned hit = __ballot_sync(0xffffffffu, take);
      if (hit != 0) {
        const int src = __ffs(hit) - 1;
        round += src;
        pos = {__shfl_sync(0xffffffffu, pos.row_tile, src), __shfl_sync(0xffffffffu, pos.seq, src),
               __shfl_sync(0xffffffffu, pos.kv_head, src)};
        m = {__shfl_sync(0xffffffffu, m.seq_len, src), __shfl_sync(0xffffffffu, m.q_begin, src),
             __shfl_sync(0xffffffffu, m.q_end, src), 0};
        return PrefillWork::make_at<kBlockM>(p.a, m, pos.seq, pos.kv_head, pos.row_tile * kBlockM);
      }
      if (__ballot_sync(0xffffffffu, item < num_items) == 0) return WorkItem{};  // past the end: inactive
    }
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
