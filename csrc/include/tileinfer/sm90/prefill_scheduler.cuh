// Persistent tile scheduler of the Hopper prefill kernel: a grid of at most
// one block per SM walks the work items (row tile, sequence, KV head) with a
// stride of the grid size. Items are numbered heaviest first: the last row
// tiles (the latest queries, which see the most keys under causal masking)
// of every sequence and head come first, so the short items fill the end of
// the launch. Row tiles past a sequence's queries are inactive and cost one
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
  __device__ int next(int item) const { return item + gridDim.x; }
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
