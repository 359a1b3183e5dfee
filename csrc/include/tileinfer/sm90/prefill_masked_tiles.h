// Which key tiles of a Hopper prefill item need the per-score mask
// (prefill_mask.cuh's TileMask), as two tile indices per item and thread.
// Host and device code: a CPU test checks it against the per-tile
// definition (tests/test_prefill_mask.py). No CUDA header.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace tileinfer {
namespace sm90 {

// Which of an item's tiles need the per-score test (TileMask::apply), worked
// out once per item so that the key loop keeps two values for it: tiles from
// `from` on hold the item's key end or (causal) keys past the warpgroup's
// first row (qmin), tiles before `until` keys before this thread's later
// row's window (lo_last: its first visible key); and any tile with a box
// outside the pool.
struct MaskedTiles {
  int from;
  int until;

  template <int kBlockN>
  TILEINFER_HD static MaskedTiles make(int key_begin, int key_end, bool causal, int qmin, int lo_last) {
    // tile i holds key_end: key_begin + (i + 1) kBlockN > key_end; past qmin:
    // key_begin + (i + 1) kBlockN - 1 > qmin (floor division: qmin may lie
    // before key_begin). In 64 bits: a row of no query has position INT_MAX
    // (row_query), and so a window edge near it.
    const int tail = (key_end - key_begin) / kBlockN;
    const int64_t d = static_cast<int64_t>(qmin) - key_begin + 1;
    const int diagonal = static_cast<int>(d >= 0 ? d / kBlockN : -((kBlockN - 1 - d) / kBlockN));
    const int64_t before = static_cast<int64_t>(lo_last) - key_begin;
    const int until = before <= 0 ? 0 : static_cast<int>((before + kBlockN - 1) / kBlockN);
    return {causal && diagonal < tail ? diagonal : tail, until};
  }
  TILEINFER_HD bool operator()(int i, uint32_t outside) const {
    return outside != 0 || i >= from || i < until;
  }
};

}  // namespace sm90
}  // namespace tileinfer
