// The shared-memory traffic of the mma.sync tile kernel (attention_tile_kernel)
// around its math: the walk over a block's keys kBlockN at a time with the
// K / V tile copies (KeyTiles), the block's query rows in (copy_query_rows),
// its output rows and lse out (store_output_rows).
//
// Key walk: thread k < kBlockN looks up key k of a tile, and the copies of the
// tile then read the looked-up pool rows from shared memory. Shared memory
// (the kernel lays it out):
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
#include <type_traits>

#include "attention_work.cuh"
#include "mma.cuh"
#include "params.h"

namespace tileinfer {

template <int kBlockN, int kStages, int kSlots>
struct KeyTiles {
  static constexpr int kFlags = kBlockN / 32;

  const PagedKVParams& kv;
  const WorkItem& w;
  int tid;         // threadIdx.x
  int page_shift;  // log2(page_size)
  int* key_rows;
  int* flags;
  int* entries;
  int row_bytes;  // bytes of a cached row (head_dim elements): kRowBytes of copy_kv, or fewer (tile_table.h)

  // Pool rows of the keys of tile `tile` into its slot, and the slot's flags,
  // from the entries fetch_entries copied kStages tiles earlier.
  __device__ __forceinline__ void lookup(int tile) const {
    lookup_with(tile, [&] { return entries[(tile % kStages) * kBlockN + tid]; });
  }

  // The first kStages tiles' lookups (nothing fetched their entries) in two
  // steps, so that a thread's loads for all of them are in flight at once
  // (one round trip instead of one per tile): first_entries reads the
  // block-table entries of this thread's keys (0 for none; kL2: from L2, as
  // load_meta), lookup_entries takes them.
  template <bool kL2 = false>
  __device__ __forceinline__ void first_entries(int (&e)[kStages], int num_tiles) const {
#pragma unroll
    for (int j = 0; j < kStages; ++j) e[j] = j < num_tiles ? first_entry<kL2>(j) : 0;
  }
  __device__ __forceinline__ void lookup_entries(const int (&e)[kStages], int num_tiles) const {
#pragma unroll
    for (int j = 0; j < kStages; ++j)
      if (j < num_tiles) lookup_with(j, [&] { return e[j]; });
  }

  // Block-table entries of the keys of tile `tile`, copied asynchronously by
  // the thread that will look them up (so no barrier is needed before it does).
  __device__ __forceinline__ void fetch_entries(int tile) const {
    const int pos = tile_start(tile) + tid;
    if (tid < kBlockN && pos < w.key_end) {
      cp_async_4(entries + (tile % kStages) * kBlockN + tid,
                 kv.block_tables + static_cast<int64_t>(w.seq) * kv.max_pages + (pos >> page_shift), true);
    }
  }

  // The K and V rows of tile `tile` (pool rows from its lookup, -1: zeros) into
  // the stage buffers k_dst / v_dst, kChunks 16-byte chunks per row, chunk ch
  // of key row r at byte offset(r, ch); consecutive threads copy consecutive
  // 16 bytes of a row. A head dim below the tile's (row_bytes < kRowBytes)
  // gets zeros in the chunks past its row. Then the block-table entries
  // kStages tiles ahead.
  // kPageRuns: tiles on one page take the path below (see there).
  // kPadsZeroed: the kernel zeroes the stages' chunks past a short row once
  // per work item (zero_pads), so rows where skips_pads holds copy only
  // their own chunks.
  template <int kThreads, int kChunks, int kRowBytes, bool kPageRuns, bool kPadsZeroed = false, class Offset>
  __device__ __forceinline__ void copy_kv(int tile, const uint8_t* k_pool, const uint8_t* v_pool, uint8_t* k_dst,
                                          uint8_t* v_dst, Offset offset) const {
    static_assert((kBlockN * kChunks) % kThreads == 0 && kThreads % kChunks == 0, "whole copy rounds of whole rows");
    static_assert(kRowBytes == kChunks * 16, "rows of 16-byte chunks");
    const int* rows = key_rows + (tile % kSlots) * kBlockN;
    // A tile whose keys are all on one page (and in the key range) is
    // kBlockN consecutive pool rows: one lookup, and each copy's source is the
    // tile's first row plus a constant per thread and round, instead of a
    // shared-memory load and a 64-bit product per copy. For decode, a stream
    // over the cache (on the H200 with 64-position pages, 4% less time for
    // 32 sequences of 4k positions at d 256); prefill is bound by its math, and its int8 tile, at 255
    // registers, spilled with it.
    const int pos = tile_start(tile);
    const int row0 = rows[0];
    if (kPageRuns && row_bytes == kRowBytes && (pos >> page_shift) == ((pos + kBlockN - 1) >> page_shift) && pos + kBlockN <= w.key_end &&
        row0 >= 0) {
      const int64_t src = static_cast<int64_t>(row0) * kRowBytes + tid * 16;
#pragma unroll
      for (int i = 0; i < kBlockN * kChunks / kThreads; ++i) {
        const int dst = offset(tid / kChunks + i * (kThreads / kChunks), tid % kChunks);
        cp_async_16(k_dst + dst, k_pool + src + i * kThreads * 16, true);
        cp_async_16(v_dst + dst, v_pool + src + i * kThreads * 16, true);
      }
      fetch_entries(tile + kStages);
      return;
    }
    if (kPadsZeroed && skips_pads<kChunks, kRowBytes>()) {
      // Only the rows' own chunks (zero_pads wrote the rest). A loop of its
      // own: with this test inside the loop below, d 80's copies, which keep
      // their zero fill, took 5% longer.
#pragma unroll
      for (int i = 0; i < kBlockN * kChunks / kThreads; ++i) {
        const int c = tid + i * kThreads;
        const int ch = c % kChunks;  // the same in every round (kThreads % kChunks == 0)
        if (ch * 16 >= row_bytes) continue;
        const int row = c / kChunks;
        const int pr = rows[row];
        const int64_t src = pr >= 0 ? static_cast<int64_t>(pr) * row_bytes + ch * 16 : 0;
        const int dst = offset(row, ch);
        cp_async_16(k_dst + dst, k_pool + src, pr >= 0);
        cp_async_16(v_dst + dst, v_pool + src, pr >= 0);
      }
      fetch_entries(tile + kStages);
      return;
    }
#pragma unroll
    for (int i = 0; i < kBlockN * kChunks / kThreads; ++i) {
      const int c = tid + i * kThreads;
      const int row = c / kChunks;
      const int ch = c % kChunks;
      const int pr = rows[row];
      const bool valid = pr >= 0 && ch * 16 < row_bytes;
      const int64_t src = valid ? static_cast<int64_t>(pr) * row_bytes + ch * 16 : 0;
      const int dst = offset(row, ch);
      cp_async_16(k_dst + dst, k_pool + src, valid);
      cp_async_16(v_dst + dst, v_pool + src, valid);
    }
    fetch_entries(tile + kStages);  // lands with this tile, kStages tiles before its lookup
  }

  // Rows shorter than the tile's whose two rows per warp of copies are whole
  // 128-byte lines (16-bit head dim 96 on the d 128 tile: 384 bytes, three
  // lines) leave their zero chunks to zero_pads instead of zero-filling copies.
  // On the H200, 32 x 4k decode at d 96 went from 117 to 100 us without those
  // copies, while d 80 (two rows: 2.5 lines) went from 86 to 99 us, so d 80
  // keeps them (docs/PERFORMANCE.md, "Head dims 80 and 96").
  template <int kChunks, int kRowBytes>
  __device__ __forceinline__ bool skips_pads() const {
    return kChunks == 16 && row_bytes < kRowBytes && row_bytes % 64 == 0;
  }
  // Zeros in the chunks past each row of `tiles` staged K or V tiles (kBlockN
  // rows of kRowBytes each, from `stages` on, chunk ch of row r at byte
  // offset(r, ch)) where copy_kv<..., kPadsZeroed = true> leaves them.
  // Before an item's first copies: nothing else writes those chunks until
  // the epilogue reuses the stages, or a walk's split end one stage (then
  // that stage's again, attention_kernel.cuh).
  template <int kThreads, int kChunks, int kRowBytes, class Offset>
  __device__ __forceinline__ void zero_pads(uint8_t* stages, int tiles, Offset offset) const {
    if (!skips_pads<kChunks, kRowBytes>()) return;
    const int data_ch = row_bytes >> 4;
    const int pad_ch = kChunks - data_ch;
    for (int c = tid; c < tiles * kBlockN * pad_ch; c += kThreads) {
      const int t = c / (kBlockN * pad_ch);
      const int r = c - t * (kBlockN * pad_ch);
      const int row = r / pad_ch;
      *reinterpret_cast<uint4*>(stages + t * kBlockN * kRowBytes + offset(row, data_ch + r - row * pad_ch)) =
          make_uint4(0u, 0u, 0u, 0u);
    }
  }

 private:
  // Position of key 0 of tile `tile`.
  __device__ __forceinline__ int tile_start(int tile) const { return w.key_begin + tile * kBlockN; }
  // The block-table entry of this thread's key of the first tile `tile`.
  template <bool kL2>
  __device__ __forceinline__ int first_entry(int tile) const {
    const int pos = tile_start(tile) + tid;
    if (tid >= kBlockN || pos >= w.key_end) return 0;
    return load_meta<kL2>(kv.block_tables + static_cast<int64_t>(w.seq) * kv.max_pages + (pos >> page_shift));
  }
  // Pool row of this thread's key of tile `tile`, from its page's block-table
  // entry (entry(), read only for a key in range), into the tile's slot, and
  // the slot's flags.
  template <class Entry>
  __device__ __forceinline__ void lookup_with(int tile, Entry entry) const {
    if (tid < kBlockN) {
      const int pos = tile_start(tile) + tid;
      const int row = pos < w.key_end ? pool_row_on_page(kv, entry(), w.kv_head, pos) : -1;
      const int slot = tile % kSlots;
      key_rows[slot * kBlockN + tid] = row;
      const unsigned skipped = __ballot_sync(0xffffffffu, row < 0);
      if ((tid & 31) == 0) flags[slot * kFlags + (tid >> 5)] = skipped != 0u;
    }
  }
};

// The block's query rows (row_token / row_head: write_row_table) into shared
// memory, kChunks 16-byte chunks per row, chunk ch of row r at byte offset(r,
// ch); rows of no query, and the chunks past the head dim, get zeros.
template <int kRows, int kThreads, int kChunks, typename T, class Offset>
__device__ __forceinline__ void copy_query_rows(const AttentionParams& p, const int* row_token, const int* row_head,
                                                void* q_s, int tid, Offset offset) {
  const T* q_ptr = static_cast<const T*>(p.q);
  for (int c = tid; c < kRows * kChunks; c += kThreads) {
    const int row = c / kChunks;
    const int ch = c % kChunks;
    const int token = row_token[row];
    const bool valid = token >= 0 && ch * 8 < p.kv.head_dim;
    const T* src = q_ptr;
    if (valid) src += token * p.q_stride_token + row_head[row] * p.q_stride_head + ch * 8;
    cp_async_16(static_cast<uint8_t*>(q_s) + offset(row, ch), src, valid);
  }
}

// Columns col..col + 3 of row `row` of the block's staged fp32 output (o_s:
// kParts slices of [kRows][kOStride], summed in slice order: the tile
// kernel's key-slice warps).
template <int kRows, int kParts, int kOStride>
__device__ __forceinline__ float4 staged_row_sum(const float* o_s, int row, int col) {
  float4 acc = *reinterpret_cast<const float4*>(o_s + row * kOStride + col);
#pragma unroll
  for (int part = 1; part < kParts; ++part) {
    const float4 more = *reinterpret_cast<const float4*>(o_s + (part * kRows + row) * kOStride + col);
    acc.x += more.x;
    acc.y += more.y;
    acc.z += more.z;
    acc.w += more.w;
  }
  return acc;
}

// The block's normalized fp32 output rows, staged in shared memory (o_s, as
// staged_row_sum reads it), as 16-byte stores of elements O at
// row_ptr(token, head); rows of no query are skipped, and so are the columns
// past the head dim d (<= kD).
template <int kRows, int kD, int kThreads, int kParts, int kOStride, class RowPtr>
__device__ __forceinline__ void store_output_rows(const float* o_s, const int* row_token, const int* row_head, int tid,
                                                  int d, RowPtr row_ptr) {
  using O = std::remove_pointer_t<decltype(row_ptr(0, 0))>;
  constexpr int kVec = Vec16<O>::kSize;
  for (int idx = tid; idx < kRows * (kD / kVec); idx += kThreads) {
    const int row = idx / (kD / kVec);
    const int col = (idx % (kD / kVec)) * kVec;
    const int token = row_token[row];
    if (token < 0 || col >= d) continue;
    float v[kVec];
#pragma unroll
    for (int x = 0; x < kVec; x += 4) {
      const float4 acc = staged_row_sum<kRows, kParts, kOStride>(o_s, row, col + x);
      v[x] = acc.x;
      v[x + 1] = acc.y;
      v[x + 2] = acc.z;
      v[x + 3] = acc.w;
    }
    Vec16<O> vec;
#pragma unroll
    for (int x = 0; x < kVec; ++x) vec.v[x] = from_float<O>(v[x]);
    *reinterpret_cast<Vec16<O>*>(row_ptr(token, row_head[row]) + col) = vec;
  }
}

}  // namespace tileinfer
