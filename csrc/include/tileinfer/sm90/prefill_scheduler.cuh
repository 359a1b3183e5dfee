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
// every round). Row tiles past a sequence's queries are inactive and cost one
// metadata read. The order is a function of shapes only; positions are read
// on the device when an item is made.
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

  __device__ int first() const { return blockIdx.x; }
  // The next round's item of this block; once one is past the end, so are all later ones.
  __device__ int next(int item) const {
    const int round = item / gridDim.x + 1;
    return round * gridDim.x + (round % 2 == 0 ? blockIdx.x : gridDim.x - 1 - blockIdx.x);
  }
  __device__ bool valid(int item) const { return item < num_items; }

  template <int kBlockM>
  __device__ WorkItem make(const PrefillParams& p, int item) const {
    const int row_tile = p.num_row_tiles - 1 - item / per_row_tile;
    const int rest = item % per_row_tile;
    const int seq = rest / p.a.kv.num_kv_heads;
    const int kv_head = rest % p.a.kv.num_kv_heads;
    return PrefillWork::make_at<kBlockM>(p.a, read_seq_meta<false>(p.a.kv, seq), seq, kv_head,
                                         row_tile * kBlockM);
  }
};

}  // namespace sm90
}  // namespace tileinfer
