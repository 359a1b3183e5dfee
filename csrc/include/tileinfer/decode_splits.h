// The decode split rule: how many splits each (sequence, KV head) of a decode
// step gets. Plain C++ (no torch, no CUDA): csrc/attention.cpp (the attention
// op and the op decode_num_splits) uses it.
#pragma once

#include <algorithm>
#include <cstdint>

#ifdef __CUDACC__
#define TILEINFER_HOST_DEVICE __host__ __device__
#else
#define TILEINFER_HOST_DEVICE
#endif

namespace tileinfer {

// Splits per (sequence, KV head): enough blocks for about two per SM (the decode
// kernel's residency: decode_tile_small at d = 128 and decode_tile_quant_wide,
// tile_table.h) even for a single sequence, rounded down so that the blocks
// never spill a fraction of a wave past those slots (on the H200, 132 SMs, 8
// sequences at 32k positions with 5 splits launch 320 blocks for 264 slots, 1.2
// waves, and take longer than with 4 splits, one wave). Row tiles are not
// counted: a launch of 17-32 packed rows takes the tile of two blocks a split
// only where they fit those slots (decode.cu, decode_small_tile). At most 32
// splits: more speed up a single long sequence by a few percent but slow
// short ones (1k-4k positions) by 10-15%, and combine's cost grows with
// them. Fewer than 8 (sequence, KV head) pairs (one sequence of an MQA
// model, or of 2-4 KV heads) raise that cap to 256 / pairs, at most 128, so
// the step still fills the SMs about once: one sequence of one KV head (32
// query heads) at 32k positions takes 28 us with 32 blocks on the H200, twice
// cuDNN's time, 15.5 us with 128 and 16.3 with 256; at 4k positions 10.3 us
// with 128 and 16-17 with 256, whose blocks mostly hold no page and whose
// partials combine reads.
// The same rule for every step (1-16 queries) and cache type: a step of 16
// queries of one sequence at 8k positions takes half the time with 32 splits
// as with a cap of 8, and the int8 cache's wide tile also runs two blocks per SM. Never depends on
// context length (a captured graph replays the same grid as sequences grow);
// empty splits write a neutral partial.
inline int64_t decode_num_splits_for(int64_t num_sms, int64_t num_seqs, int64_t num_kv_heads) {
  const int64_t sms = num_sms > 0 ? num_sms : 8;  // 8: the CPU path's "SMs" (threads it splits over)
  constexpr int64_t per_sm = 2;
  const int64_t work = std::max<int64_t>(1, num_seqs * num_kv_heads);
  const int64_t max_splits = std::clamp<int64_t>(256 / work, 32, 128);
  const int64_t want = (per_sm * sms) / work;
  return std::min(max_splits, std::max<int64_t>(1, want));
}

// How a decode launch cuts each sequence's keys. There are num_splits
// partials per (sequence, KV head); a sequence whose range holds P pages (from
// the window's first page on) gives split i the pages
// [i * n, (i + 1) * n) with n = pages_per_split(P, divisor, min_pages), and the
// splits past its end are neutral. By default divisor is num_splits and
// min_pages 1: the splits share the pages evenly, the boundaries follow
// num_splits, which follows the batch, and the grid has a block per split.
struct DecodePlan {
  int64_t num_splits = 1;
  int64_t divisor = 1;
  int64_t min_pages = 1;
  // Boundaries and decode tiles that do not depend on the batch
  // (docs/CONTRACT.md, "Numerics"): divisor and min_pages are constants,
  // num_splits only covers the splits any sequence of the block table can
  // have, and the tile is chosen from the group size alone (csrc/ops/decode.cu). The grid then
  // has grid_splits blocks per (sequence, KV head), the default rule's count
  // or fewer, which walk the splits in turn (attention_work.cuh), so that a
  // table wide enough for 32 splits costs no block for the splits a short
  // sequence leaves empty.
  bool batch_invariant = false;
  int64_t grid_splits = 1;
};

TILEINFER_HOST_DEVICE inline int64_t pages_per_split(int64_t pages, int64_t divisor, int64_t min_pages) {
  const int64_t even = (pages + divisor - 1) / divisor;
  return even > min_pages ? even : min_pages;
}

// n splits sharing each sequence's pages evenly, a block each (the decode
// op's plan for the partials it is given).
inline DecodePlan even_decode_plan(int64_t n) { return DecodePlan{n, n, 1, false, n}; }

inline DecodePlan decode_plan_for(int64_t num_sms, int64_t num_seqs, int64_t num_kv_heads) {
  return even_decode_plan(decode_num_splits_for(num_sms, num_seqs, num_kv_heads));
}

// The batch-invariant plan: a sequence of P pages gets splits of
// max(ceil(P / 32), ceil(256 / page_size)) pages, so at most 32 splits and
// none shorter than 256 positions; a split count from its own length only.
// 256 trades the two ends (PERFORMANCE.md, "Decode split counts and batch
// invariance"): a lone short sequence wants many splits, a large batch one
// a sequence, and each split's end costs the block that walks it (about
// 1 us where it is alone on its SM, with 128). There are
// ceil(max_pages / min_pages) partials, at most 32 (max_pages: the block
// table's width, a shape), walked by the default rule's count of blocks
// (default_splits) or fewer.
// (split_positions: 256 but for a measurement, TILEINFER_INVARIANT_SPLIT_POSITIONS, csrc/attention.cpp.)
constexpr int64_t kInvariantMaxSplits = 32;
constexpr int64_t kInvariantSplitPositions = 256;
inline DecodePlan invariant_decode_plan(int64_t max_pages, int64_t page_size, int64_t default_splits,
                                        int64_t split_positions = kInvariantSplitPositions) {
  const int64_t min_pages = std::max<int64_t>(1, (split_positions + page_size - 1) / page_size);
  const int64_t n = std::clamp<int64_t>((max_pages + min_pages - 1) / min_pages, 1, kInvariantMaxSplits);
  return DecodePlan{n, kInvariantMaxSplits, min_pages, true, std::clamp<int64_t>(default_splits, 1, n)};
}

// A run of splits (attention_work.cuh, DecodeWalkWork::walk_through): of a
// (sequence, KV head)'s `live` splits that hold keys, block `block` of the
// pair's `blocks` walks [first, first + count) as one key range (count 0:
// none; blocks 0 .. runs - 1 have one), and writes the lse of the empty
// splits empty, empty + blocks, ... below the plan's split slots. The empty
// splits go to the blocks in turn, those without a run first. Every split
// is walked or written once (tests/test_splits.py walks them all).
struct SplitRun {
  int first;
  int count;
  int empty;
};
TILEINFER_HOST_DEVICE inline SplitRun split_run(int live, int blocks, int block) {
  const int per = (live + blocks - 1) / blocks;
  const int runs = (live + per - 1) / per;
  const int first = block * per;
  const int left = live - first;
  return SplitRun{first, block < runs ? (left < per ? left : per) : 0,
                  live + (block < runs ? blocks - runs + block : block - runs)};
}

}  // namespace tileinfer
