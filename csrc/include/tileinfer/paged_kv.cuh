// Device-side view of the paged cache and the step's metadata, bounds-safe for
// ANY contents of block_tables / seq_lens / cu_seqlens_q (the bad-input contract):
// lengths are clamped to what the block table can hold, page ids outside the
// pool read as "no page" (the kernels skip those positions), query ranges are
// clamped to the token count. The validation helper in Python reports such
// entries; the kernels only have to stay inside the buffers.
#pragma once

#include "common.cuh"
#include "params.h"

namespace tileinfer {

// Positions a sequence holds (len: its seq_lens entry), clamped to [0,
// max_pages * page_size].
__device__ __forceinline__ int clamp_seq_len(const PagedKVParams& p, int len) {
  int cap = p.max_pages * p.page_size;
  return len < 0 ? 0 : (len > cap ? cap : len);
}

// Whether a block-table entry names a page of the pool.
__device__ __forceinline__ bool page_in_pool(const PagedKVParams& p, int page) {
  return page >= 0 && page < p.num_pages;
}

// Page id of the j-th page of a sequence, or -1 when the entry is outside the pool.
__device__ __forceinline__ int page_of(const PagedKVParams& p, int seq, int j) {
  int page = p.block_tables[static_cast<int64_t>(seq) * p.max_pages + j];
  return page_in_pool(p, page) ? page : -1;
}

// Element offset of (page, kv_head, slot, 0) in a pool.
__device__ __forceinline__ int64_t kv_offset(const PagedKVParams& p, int page, int kv_head, int slot) {
  return ((static_cast<int64_t>(page) * p.num_kv_heads + kv_head) * p.page_size + slot) *
         static_cast<int64_t>(p.head_dim);
}

// Offset of (page, kv_head, slot) in a per-vector scale array (quantized cache).
__device__ __forceinline__ int64_t scale_offset(const PagedKVParams& p, int page, int kv_head, int slot) {
  return (static_cast<int64_t>(page) * p.num_kv_heads + kv_head) * p.page_size + slot;
}

// This step's queries of a sequence: tokens [begin, begin + count), clamped to
// [0, num_tokens). Query t sits at position seq_len - count + t.
struct QueryRange {
  int begin;
  int count;
};
// From the sequence's entries of cu_seqlens_q: b = cu_seqlens_q[seq], e = cu_seqlens_q[seq + 1].
__device__ __forceinline__ QueryRange clamp_query_range(int b, int e, int num_tokens) {
  b = b < 0 ? 0 : (b > num_tokens ? num_tokens : b);
  e = e < b ? b : (e > num_tokens ? num_tokens : e);
  return {b, e - b};
}

}  // namespace tileinfer
