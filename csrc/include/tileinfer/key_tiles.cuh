// The key walk shared by the tensor-core attention kernels (attention_tile_kernel,
// attention_wgmma_kernel): a block walks its keys kBlockN at a time; thread k <
// kBlockN (tid: threadIdx.x) looks up key k of a tile, and the copies of the tile then read the
// looked-up pool rows from shared memory.
//
// Shared memory it uses (the kernel lays it out):
//   key_rows [kSlots][kBlockN]  pool row of each key of a tile, -1: skipped
//   flags    [kSlots][kBlockN / 32]  per warp: does the tile skip any key
//                                    (then it takes the masked path)
//   entries  [kStages][kBlockN]  block-table entry of each key's page, copied
//                                with the K / V tile kStages before its lookup
// The first kStages tiles read the block table directly; later ones take the
// entries that fetch_entries copied, so the main loop never waits on a
// block-table load. (On an H200 the bf16 decode did not change with it, at
// 1 x 32k or 8 x 32k; the instruction-bound int8 loop was not measured without it.)
#pragma once

#include <cstdint>

#include "attention_work.cuh"
#include "mma.cuh"
#include "params.h"

namespace tileinfer {

template <int kBlockN, int kStages, int kSlots>
struct KeyTiles {
  static constexpr int kFlags = kBlockN / 32;

  // Pool rows of the keys of tile `tile` into its slot, and the slot's flags.
  __device__ __forceinline__ static void lookup(const PagedKVParams& kv, const WorkItem& w, int tid, int tile,
                                                bool prefetched, int page_shift, int* key_rows, int* flags,
                                                const int* entries) {
    if (tid < kBlockN) {
      const int slot = tile % kSlots;
      const int pos = w.key_begin + tile * kBlockN + tid;
      const int row = !prefetched ? pool_row(kv, w.seq, w.kv_head, pos, w.key_end, page_shift)
                      : pos < w.key_end ? pool_row_on_page(kv, entries[(tile % kStages) * kBlockN + tid], w.kv_head, pos)
                                        : -1;
      key_rows[slot * kBlockN + tid] = row;
      const unsigned skipped = __ballot_sync(0xffffffffu, row < 0);
      if ((tid & 31) == 0) flags[slot * kFlags + (tid >> 5)] = skipped != 0u;
    }
  }

  // Block-table entries of the keys of tile `tile`, copied asynchronously by
  // the thread that will look them up (so no barrier is needed before it does).
  __device__ __forceinline__ static void fetch_entries(const PagedKVParams& kv, const WorkItem& w, int tid,
                                                       int tile, int page_shift, int* entries) {
    const int pos = w.key_begin + tile * kBlockN + tid;
    if (tid < kBlockN && pos < w.key_end) {
      cp_async_4(entries + (tile % kStages) * kBlockN + tid,
                 kv.block_tables + static_cast<int64_t>(w.seq) * kv.max_pages + (pos >> page_shift), true);
    }
  }

  // The K and V rows of a tile's keys (pool rows `rows`, -1: zeros) into the
  // stage buffers k_dst / v_dst, kChunks 16-byte chunks per row, chunk ch of
  // key row r at byte offset(r, ch); consecutive threads copy consecutive 16
  // bytes of a row.
  template <int kThreads, int kChunks, int kRowBytes, class Offset>
  __device__ __forceinline__ static void copy_kv(const uint8_t* k_pool, const uint8_t* v_pool, const int* rows,
                                                 uint8_t* k_dst, uint8_t* v_dst, int tid, Offset offset) {
    static_assert((kBlockN * kChunks) % kThreads == 0, "whole copy rounds");
#pragma unroll
    for (int i = 0; i < kBlockN * kChunks / kThreads; ++i) {
      const int c = tid + i * kThreads;
      const int row = c / kChunks;
      const int ch = c % kChunks;
      const int pr = rows[row];
      const int64_t src = static_cast<int64_t>(pr < 0 ? 0 : pr) * kRowBytes + ch * 16;
      const int dst = offset(row, ch);
      cp_async_16(k_dst + dst, k_pool + src, pr >= 0);
      cp_async_16(v_dst + dst, v_pool + src, pr >= 0);
    }
  }
};

}  // namespace tileinfer
