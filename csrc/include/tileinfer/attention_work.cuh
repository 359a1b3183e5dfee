// How attention work is mapped onto blocks: the only difference between the
// prefill and decode kernels (which share attention_kernel.cuh, and the fp32
// path in attention_fp32.cuh).
//
// A block computes a tile of query *rows* against the key positions
// [key_begin, key_end) of one sequence and one KV head. Row rr of a sequence's
// row space is query rr / group of the step, for query head head0 + rr % group,
// group = query heads per KV head (GQA packing): rows are (query, head) pairs of
// the whole group, so each key page is read once per group. (The Hopper
// warp-specialized prefill can also take an item per query head: WorkItem::group
// is then 1; PrefillWork::make_at.) Prefill and decode
// differ in how they cut the keys (decode: splits, written as partials) and
// the rows (prefill: many row tiles, heaviest first).
// Everything positional (sequence length, query offsets, page ids) is read on
// the device; the grid depends on shapes only (CUDA graphs).
#pragma once

#include <climits>

#include "common.cuh"
#include "decode_splits.h"
#include "paged_kv.cuh"
#include "params.h"

namespace tileinfer {

struct WorkItem {
  int seq;
  int kv_head;
  int seq_len;    // positions the sequence holds, clamped to what its block table can hold
  int q_begin;    // first token of the sequence's queries this step
  int q_count;    // this step's query count (query t sits at seq_len - q_count + t)
  int row_base;   // first row of this block in the sequence's row space
  int head0;      // row rr belongs to query rr / group, query head head0 + rr % group
  int group;      // query heads of the item: the KV head's group (GQA packing), or fewer (make_at)
  int key_begin;  // key positions walked: [key_begin, key_end), key_begin page-aligned (window_key_begin)
  int key_end;
  int split;      // which partial this block writes (decode), 0 for prefill
  bool active;    // false: no row of this block is a query of the step
};

// What a block's work item is made from, as read: its sequence's entries of
// seq_lens and cu_seqlens_q, and for decode's blocks that mark the padding
// tokens (mark_padding_rows) cu_seqlens_q[num_seqs]. The tensor-core decode
// kernel reads them, and its first tiles' block-table entries, before it
// waits for the previous kernel, then again after the wait (kL2:
// ld.global.cg, from L2), and starts over on any difference
// (attention_kernel.cuh).
struct StepMeta {
  int seq_len;
  int q_begin;
  int q_end;
  int padding_begin;  // 0 for the blocks that do not mark
};
template <bool kL2>
__device__ __forceinline__ int load_meta(const int* p) {
  return kL2 ? __ldcg(p) : *p;
}
template <bool kL2>
__device__ __forceinline__ StepMeta read_seq_meta(const PagedKVParams& kv, int seq) {
  return {load_meta<kL2>(kv.seq_lens + seq), load_meta<kL2>(kv.cu_seqlens_q + seq),
          load_meta<kL2>(kv.cu_seqlens_q + seq + 1), 0};
}
__device__ __forceinline__ bool operator!=(const StepMeta& a, const StepMeta& b) {
  return a.seq_len != b.seq_len || a.q_begin != b.q_begin || a.q_end != b.q_end ||
         a.padding_begin != b.padding_begin;
}

// Row r of a block: a (query, query head) pair of its item's heads. The
// token (-1: no query), the query head, and the query's position (INT_MAX for
// no query: never masked).
struct RowQuery {
  int token;
  int head;
  int qpos;
};
// kPow2Group: the group is a power of two (the Hopper prefill kernel's), so
// a shift and a mask replace the division by a run-time divisor (about 20
// instructions).
template <bool kPow2Group = false>
__device__ __forceinline__ RowQuery row_query(const WorkItem& w, int r) {
  const int rr = w.row_base + r;
  const int t = kPow2Group ? rr >> (__ffs(w.group) - 1) : rr / w.group;
  const int h = kPow2Group ? rr & (w.group - 1) : rr % w.group;
  const bool valid = t < w.q_count;
  return {valid ? w.q_begin + t : -1, w.head0 + h, valid ? w.seq_len - w.q_count + t : INT_MAX};
}

// The block's row table in shared memory: row_query of each of its BM rows.
template <int BM, int kThreads>
__device__ __forceinline__ void write_row_table(const WorkItem& w, int tid, int* row_token, int* row_head,
                                                int* row_qpos) {
  for (int r = tid; r < BM; r += kThreads) {
    const RowQuery q = row_query(w, r);
    row_token[r] = q.token;
    row_head[r] = q.head;
    row_qpos[r] = q.qpos;
  }
}

// First key position that a query at `qpos` sees under a sliding window of
// `window_left` keys to its left (INT_MAX: no window): qpos - window_left,
// never below 0. Written as qpos - min(qpos, window_left) so that no value of
// qpos (negative for malformed metadata, INT_MAX for rows of no query)
// overflows.
__device__ __forceinline__ int window_first_key(int qpos, int window_left) { return qpos - min(qpos, window_left); }

// Where a key walk of a sequence starts under the window: the first key that
// its query t sees (query t at seq_len - q_count + t), down to its page, so
// that the pages before it, wholly outside every later query's window too,
// are never read. 0 without a window. Prefill blocks start at their first
// query's; decode starts every split range at the step's first query's.
__device__ __forceinline__ int window_key_begin(const AttentionParams& p, int seq_len, int q_count, int t) {
  return window_first_key(seq_len - q_count + t, p.window_left) & ~(p.kv.page_size - 1);
}

// The sink logit of query head `head` in log2 units, or -inf: what
// softmax_result_with_sink takes. Only the blocks that hold `with_sink` add it, so that
// it joins each row's denominator once (decode: split 0's partial).
__device__ __forceinline__ float sink_log2(const AttentionParams& p, int head, bool with_sink) {
  return p.sinks != nullptr && with_sink ? p.sinks[head] * kLog2e : -INFINITY;
}

// Tree verify (p.tree_mask; decode only, steps of <= 16 queries): bit j of a
// query token's word says whether it sees token j of its sequence's step, the
// key at seq_len - q_count + j; every position before the step is visible, so
// only the key tiles that reach tree_first_key test the bits (INT_MAX without
// a tree: no tile). Any bits are safe: a bit past the step's tokens names a key
// past seq_len (not there) or, under causal, after the query (masked anyway);
// a j >= 32, which only malformed metadata gives, hides nothing.
__device__ __forceinline__ int tree_first_key(const AttentionParams& p, const WorkItem& w) {
  return p.tree_mask == nullptr ? INT_MAX : w.seq_len - w.q_count;
}
// The word of a row's query token (all ones without a tree or for no query).
__device__ __forceinline__ uint32_t tree_word(const AttentionParams& p, int token) {
  return p.tree_mask == nullptr || token < 0 ? ~0u : p.tree_mask[token];
}
__device__ __forceinline__ bool tree_hides(uint32_t word, int kpos, int first_key) {
  const unsigned j = static_cast<unsigned>(kpos) - static_cast<unsigned>(first_key);  // before the step: >= 2^31
  return j < 32u && !((word >> j) & 1u);
}

// Last key position (exclusive) that a causal query tile can see: its last query
// sits at seq_len - q_count + last_t. Malformed metadata (more queries than
// positions) gives 0, never a negative bound.
__device__ __forceinline__ int causal_key_end(int seq_len, int q_count, int last_t) {
  const int end = seq_len - q_count + last_t + 1;
  return end < 0 ? 0 : (end < seq_len ? end : seq_len);
}

// Pool row of position `pos` (see pool_row) from its page's block-table entry, -1
// for an entry outside the pool.
__device__ __forceinline__ int pool_row_on_page(const PagedKVParams& kv, int page, int kv_head, int pos) {
  if (!page_in_pool(kv, page)) return -1;
  return (page * kv.num_kv_heads + kv_head) * kv.page_size + (pos & (kv.page_size - 1));
}

// Row of key position `pos` in a pool viewed as [num_pages * num_kv_heads *
// page_size, head_dim], or -1 when the position is skipped: at or past key_end,
// or on a page whose id is outside the pool. Fits in int32: the launchers check
// num_pages * num_kv_heads * page_size < 2^31.
__device__ __forceinline__ int pool_row(const PagedKVParams& kv, int seq, int kv_head, int pos, int key_end,
                                        int page_shift) {
  if (pos >= key_end) return -1;  // also keeps block_tables reads inside the sequence's row
  return pool_row_on_page(kv, kv.block_tables[static_cast<int64_t>(seq) * kv.max_pages + (pos >> page_shift)],
                          kv_head, pos);
}

// Row (token, head) of the output `out` (elements of type O), and its lse (null
// when none was asked for).
template <typename O>
__device__ __forceinline__ O* output_row(const AttentionParams& p, int token, int head) {
  return static_cast<O*>(p.out) + token * p.o_stride_token + head * p.o_stride_head;
}
__device__ __forceinline__ float* output_lse(const AttentionParams& p, int token, int head) {
  return p.lse == nullptr ? nullptr : p.lse + static_cast<int64_t>(token) * p.num_q_heads + head;
}

// Mixed steps (p.mixed_queries = q > 0): the attention op runs a step whose
// sequences have any query counts as decode (+ combine) over the sequences of
// at most q queries and prefill over the others, both with grids from shapes
// alone, so one captured graph serves every mix. Each kernel's blocks of the
// other kernel's sequences are inactive. Decode's grid is sized for q queries,
// its partials are indexed by (sequence, query) slots, seq * q + t, instead of
// tokens (a step of one long prompt and a few decodes needs partials for the
// decodes only), and no block marks padding rows: like prefill, a mixed step
// leaves the rows of tokens that belong to no sequence untouched.
// Sized for q queries, the decode grid would hold group * q / 16 row tiles
// a (sequence, KV head, split) (4 at group 4), and a single-query decode
// has rows in the first only: the others' blocks, and every block of a
// prompt's sequence, would only find no rows and return; a lone 512-token
// prompt's empty decode launch took 8.6 us for its 1024 blocks (one H100),
// two thirds of the prompt's prefill. So the tile kernel's blocks walk
// their row tiles in turn (DecodeRowWalkWork), up to the first without
// rows: one block per (sequence, KV head, split), about one wave as the
// split rule sizes it (decode_splits.h); that launch took 3.4 us. Over a
// quantized cache only a step of one sequence walks (decode.cu,
// launch_decode: the walk's spills there slow real decodes).
__device__ __forceinline__ bool decode_takes(const AttentionParams& p, int q_count) {
  return p.mixed_queries == 0 || q_count <= p.mixed_queries;
}
// Does prefill compute rows [row_base, ...) of a sequence of q_count queries,
// `heads` rows a query (the query heads of one work item)?
__device__ __forceinline__ bool prefill_takes(const AttentionParams& p, int q_count, int row_base, int heads) {
  return row_base < q_count * heads && !(p.mixed_queries > 0 && decode_takes(p, q_count));
}
__host__ __device__ __forceinline__ int partial_rows(const AttentionParams& p) {
  return p.mixed_queries == 0 ? p.num_tokens : p.kv.num_seqs * p.mixed_queries;
}

// Prefill: grid (num_kv_heads, num_seqs, row tiles). GQA packing: a block's
// rows are (query, head) pairs of one KV head's group, as in decode (row rr:
// query rr / group, head head0 + rr % group), so each K / V tile is copied (and,
// from an int8 cache, converted) once for all the group's heads. On the H200
// that is 0-4% faster (bf16, 32 / 8 heads) than one query head per block with
// the heads of a group as neighbours in the launch order, sharing their pages
// through L2.
// The row tile is the slowest grid dimension and reversed, so that the last
// query tiles, the heaviest under causal masking, are dispatched first for
// every head and sequence (less tail at the end of the launch).
struct PrefillWork {
  static constexpr bool kPartials = false;  // always writes `out` itself
  static constexpr bool kTree = false;      // no tree masks (the ops reject them on prefill)
  // Waits for the previous kernel before reading the metadata (see
  // attention_kernel.cuh): prefill is compute-bound, and with the check and
  // restart of early reads the int8 prefill kernel spilled registers.
  static constexpr bool kReadsAhead = false;

  template <int kBlockM>
  static dim3 grid(const AttentionParams& p) {
    return dim3(p.kv.num_kv_heads, p.kv.num_seqs, ceil_div(p.group_size * p.max_q_len, kBlockM));
  }

  __device__ static int block_seq() { return blockIdx.y; }
  template <bool kL2 = false>
  __device__ static StepMeta read_meta(const AttentionParams& p) {
    return read_seq_meta<kL2>(p.kv, block_seq());
  }

  template <int kBlockM>
  __device__ static WorkItem make(const AttentionParams& p) {
    return make<kBlockM>(p, read_meta(p));
  }
  template <int kBlockM>
  __device__ static WorkItem make(const AttentionParams& p, const StepMeta& m, int = 0) {
    return make_at<kBlockM>(p, m, block_seq(), blockIdx.x, (gridDim.z - 1 - blockIdx.z) * kBlockM, p.group_size);
  }
  // The item of rows [row_base, row_base + kBlockM) of sequence `seq` over
  // query heads [item_head * heads, + heads): a KV head's whole group
  // (heads = group_size, item_head = the KV head), or fewer of its heads
  // (the persistent Hopper kernel's scheduler names them itself).
  template <int kBlockM>
  __device__ static WorkItem make_at(const AttentionParams& p, const StepMeta& m, int seq, int item_head,
                                     int row_base, int heads) {
    WorkItem w;
    w.seq = seq;
    w.group = heads;
    w.head0 = item_head * heads;
    w.kv_head = heads == p.group_size ? item_head : w.head0 / p.group_size;  // (no division for a whole group)
    w.split = 0;
    w.seq_len = clamp_seq_len(p.kv, m.seq_len);
    const QueryRange qr = clamp_query_range(m.q_begin, m.q_end, p.num_tokens);
    w.q_begin = qr.begin;
    w.q_count = qr.count;
    w.row_base = row_base;
    w.active = prefill_takes(p, w.q_count, row_base, heads);
    w.key_end = w.seq_len;
    if (p.causal) {
      const int last_t = min((w.row_base + kBlockM - 1) / w.group, w.q_count - 1);
      w.key_end = causal_key_end(w.seq_len, w.q_count, last_t);
    }
    // Window: from the page of the first key that the block's first query sees.
    w.key_begin = min(window_key_begin(p, w.seq_len, w.q_count, w.row_base / w.group), w.key_end);
    return w;
  }

  // Prefill leaves the rows of tokens that belong to no sequence untouched.
  template <typename OutElem>
  __device__ static void mark_padding_rows(const AttentionParams&, int = 0) {}

  __device__ static float* lse_at(const AttentionParams& p, const WorkItem&, int token, int head) {
    return output_lse(p, token, head);
  }

  // One item a block.
  static constexpr bool kWalks = false;
  static constexpr bool kRowWalk = false;
  template <int kBlockM>
  __device__ static bool next(const AttentionParams&, const StepMeta&, WorkItem&, int) { return false; }
  __device__ static bool lse_only(const AttentionParams&, const WorkItem&, int) { return false; }

  // A prefill block holds every key of its rows: the sink joins here.
  __device__ static float sink(const AttentionParams& p, const WorkItem&, int head) { return sink_log2(p, head, true); }
};

// Decode: grid (num_splits, num_kv_heads * row_tiles, num_seqs), row_tiles =
// ceil(group * max_q_len / kBlockM) (1 for plain decode with a group of <= 16
// heads, and where the blocks walk their row tiles: DecodeRowWalkWork).
// Split i of a sequence of P pages walks pages [i * n, (i+1) * n),
// n = pages_per_split (decode_splits.h: ceil(P/S) by default); a split past
// the end walks nothing and writes the neutral partial (out 0, lse -inf;
// DecodeWalkWork below: lse only). With a window, the P pages are those from the
// page of the step's first query's first visible key on (window_key_begin),
// and split i's range is counted from there: pages wholly before the window
// are never read.
//
// With a single split and no partials given (p.partial_out null), the blocks
// write the output and its lse themselves, exactly what combine would have
// made of that one partial (the same fp32 values, rounded once): large batches
// need no split, and this saves them the combine launch and the partial traffic.
// With 2 splits and no partials (p.cluster_splits), a (sequence, KV head,
// row tile)'s split blocks are one cluster, and merge their rows into the
// output together, as combine would have (cluster_merge.cuh).
struct DecodeWork {
  static constexpr bool kWalks = false;    // one split a block (DecodeWalkWork below walks several)
  static constexpr bool kRowWalk = false;  // a block per row tile (DecodeRowWalkWork below walks them)
  static constexpr bool kPartials = true;  // partials, or `out` when p.partial_out is null
  static constexpr bool kTree = true;      // p.tree_mask, if set (tree verify steps)
  static constexpr bool kReadsAhead = true;  // metadata read before the wait (attention_kernel.cuh)
  __device__ static bool writes_partials(const AttentionParams& p) { return p.partial_out != nullptr; }

  template <int kBlockM>
  static dim3 grid(const AttentionParams& p) {
    const int row_tiles = ceil_div(p.group_size * p.max_q_len, kBlockM);
    return dim3(p.num_splits, p.kv.num_kv_heads * row_tiles, p.kv.num_seqs);
  }

  __device__ static int block_seq() { return blockIdx.z; }
  template <bool kL2 = false>
  __device__ static StepMeta read_meta(const AttentionParams& p) {
    StepMeta m = read_seq_meta<kL2>(p.kv, block_seq());
    if (marks_padding(p)) m.padding_begin = load_meta<kL2>(p.kv.cu_seqlens_q + p.kv.num_seqs);
    return m;
  }

  template <int kBlockM>
  __device__ static WorkItem make(const AttentionParams& p) {
    return make<kBlockM>(p, read_meta(p));
  }
  template <int kBlockM>
  __device__ static WorkItem make(const AttentionParams& p, const StepMeta& m, int row_step = 0) {
    return make_split<kBlockM>(p, m, blockIdx.x, row_step);
  }
  // Block x's one split is x.
  template <int kBlockM>
  __device__ static bool next(const AttentionParams&, const StepMeta&, WorkItem&, int) { return false; }
  __device__ static bool lse_only(const AttentionParams&, const WorkItem&, int) { return false; }
  // Split `split` of the block's row tile, or of its row step `row_step`
  // (DecodeRowWalkWork: row tile row_step).
  template <int kBlockM>
  __device__ static WorkItem make_split(const AttentionParams& p, const StepMeta& m, int split, int row_step) {
    WorkItem w;
    const int row_tiles = gridDim.y / p.kv.num_kv_heads;
    w.split = split;
    w.kv_head = blockIdx.y / row_tiles;
    w.seq = block_seq();
    w.group = p.group_size;
    w.head0 = w.kv_head * p.group_size;
    w.row_base = (blockIdx.y % row_tiles + row_step) * kBlockM;
    w.seq_len = clamp_seq_len(p.kv, m.seq_len);
    const QueryRange qr = clamp_query_range(m.q_begin, m.q_end, p.num_tokens);
    w.q_begin = qr.begin;
    w.q_count = qr.count;
    w.active = w.row_base < w.q_count * w.group && decode_takes(p, w.q_count);

    const SplitLayout l = split_layout(p, w);
    set_keys<kBlockM>(p, w, l.range_begin + static_cast<int64_t>(w.split) * l.split_keys, l.split_keys);
    return w;
  }
  // The splits divide the pages from the window's start on (0 without a
  // window): split i holds keys [range_begin + i * split_keys, ... + split_keys).
  struct SplitLayout {
    int range_begin;
    int split_keys;
  };
  __device__ static SplitLayout split_layout(const AttentionParams& p, const WorkItem& w) {
    const int ps = p.kv.page_size;
    const int range_begin = window_key_begin(p, w.seq_len, w.q_count, 0);
    const int64_t split_pages =
        pages_per_split(ceil_div(w.seq_len - range_begin, ps), p.split_divisor > 0 ? p.split_divisor : p.num_splits,
                        p.split_min_pages);
    return {range_begin, static_cast<int>(split_pages * ps)};  // (a sequence's positions and a page, or the floor)
  }
  // w's keys: `count` from `first` on, within the sequence and, causal within
  // the step, up to the tile's last query.
  template <int kBlockM>
  __device__ static void set_keys(const AttentionParams& p, WorkItem& w, int64_t first, int64_t count) {
    const int64_t last = first + count;
    w.key_begin = static_cast<int>(first < w.seq_len ? first : w.seq_len);
    w.key_end = static_cast<int>(last < w.seq_len ? last : w.seq_len);
    if (p.causal) {  // causal within the step: the tile's last query bounds its keys
      const int last_row_t = (w.row_base + kBlockM - 1) / w.group;
      const int last_t = min(last_row_t, w.q_count - 1);
      w.key_end = min(w.key_end, causal_key_end(w.seq_len, w.q_count, last_t));
    }
    if (w.key_end < w.key_begin) w.key_end = w.key_begin;
  }

  // Tokens past cu_seqlens_q[num_seqs] (the padding of a batch captured larger
  // than it runs) belong to no block. The row-tile-0 blocks of the last sequence
  // give them a neutral lse in their split, so combine writes 0 there instead of
  // merging stale workspace (which could hold NaN); without partials the split-0
  // block writes the 0 rows (OutElem) and -inf lse itself. Costs nothing
  // without padding.
  // (first: cu_seqlens_q[num_seqs], read with the rest of read_meta.)
  __device__ static bool marks_padding(const AttentionParams& p) {
    const int row_tiles = gridDim.y / p.kv.num_kv_heads;
    return blockIdx.z == gridDim.z - 1 && blockIdx.y % row_tiles == 0 && p.mixed_queries == 0;
  }
  template <typename OutElem>
  __device__ static void mark_padding_rows(const AttentionParams& p) {
    mark_padding_rows<OutElem>(p, marks_padding(p) ? p.kv.cu_seqlens_q[p.kv.num_seqs] : 0);
  }
  template <typename OutElem>
  __device__ static void mark_padding_rows(const AttentionParams& p, int first) {
    if (!marks_padding(p)) return;
    const int kv_head = blockIdx.y / (gridDim.y / p.kv.num_kv_heads);
    first = first < 0 ? 0 : (first > p.num_tokens ? p.num_tokens : first);
    const int n = (p.num_tokens - first) * p.group_size;
    if (writes_partials(p)) {
      const int slots = p.split_slots > 0 ? p.split_slots : static_cast<int>(blockIdx.x) + 1;
      for (int split = blockIdx.x; split < slots; split += gridDim.x) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
          const int token = first + i / p.group_size;
          const int head = kv_head * p.group_size + i % p.group_size;
          *lse_at(p, split, token, head) = -INFINITY;
        }
      }
      return;
    }
    if (blockIdx.x != 0) return;  // (a cluster's other splits: cluster_merge.cuh)
    constexpr int kVec = Vec16<OutElem>::kSize;
    const int chunks = p.kv.head_dim / kVec;
    for (int i = threadIdx.x; i < n * chunks; i += blockDim.x) {
      const int r = i / chunks;
      const int token = first + r / p.group_size;
      const int head = kv_head * p.group_size + r % p.group_size;
      Vec16<OutElem> zero;
#pragma unroll
      for (int e = 0; e < kVec; ++e) zero.v[e] = from_float<OutElem>(0.f);
      *reinterpret_cast<Vec16<OutElem>*>(output_row<OutElem>(p, token, head) + (i % chunks) * kVec) = zero;
      float* lse = output_lse(p, token, head);
      if (lse != nullptr && i % chunks == 0) *lse = -INFINITY;
    }
  }

  // The split's fp32 partial row (writes_partials), or where lse goes.
  __device__ static float* partial_row(const AttentionParams& p, const WorkItem& w, int token, int head) {
    return p.partial_out +
           ((static_cast<int64_t>(w.split) * partial_rows(p) + partial_slot(p, w, token)) * p.num_q_heads + head) *
               p.kv.head_dim;
  }
  __device__ static float* lse_at(const AttentionParams& p, const WorkItem& w, int token, int head) {
    if (!writes_partials(p)) return output_lse(p, token, head);
    return lse_at(p, w.split, partial_slot(p, w, token), head);
  }
  // Row `row` of split `split`'s lse (row: a token, or a mixed step's slot).
  __device__ static float* lse_at(const AttentionParams& p, int split, int row, int head) {
    if (!writes_partials(p)) return output_lse(p, row, head);
    return p.partial_lse + (static_cast<int64_t>(split) * partial_rows(p) + row) * p.num_q_heads + head;
  }
  __device__ static int partial_slot(const AttentionParams& p, const WorkItem& w, int token) {
    return p.mixed_queries == 0 ? token : w.seq * p.mixed_queries + (token - w.q_begin);
  }

  // The sink joins split 0's partial only (its lse and normalization), so that
  // combine, which merges partials by their lse, counts it once: merging
  // (o_0, lse_0) with the sink in and the other splits without gives exactly
  // sum_i e^lse_i o_i / (sum_i e^lse_i + e^sink). Split 0 exists for every
  // sequence, with or without pages; one split (writing out) is split 0.
  __device__ static float sink(const AttentionParams& p, const WorkItem& w, int head) {
    return sink_log2(p, head, w.split == 0);
  }
};

// A mixed step's decode (over a quantized cache, only a step of one
// sequence; "Mixed steps" above): a block per (sequence, KV head, split)
// that computes its row tiles in turn, from the first, up to the first that
// holds no rows (the kernel's loop: attention_kernel.cuh). A kernel of its
// own.
struct DecodeRowWalkWork : DecodeWork {
  static constexpr bool kRowWalk = true;
  template <int kBlockM>
  static dim3 grid(const AttentionParams& p) {
    return dim3(p.num_splits, p.kv.num_kv_heads, p.kv.num_seqs);
  }
};

// Decode under a batch-invariant plan (decode_splits.h; p.split_slots > 0):
// block x walks splits x, x + gridDim.x, ... below split_slots, each a work
// item of its own (prologue, keys, epilogue, partial), so the grid needs no
// block for each of the 32 splits a wide block table allows; or, where the
// tile allows, a run of consecutive splits as one key range (walk_through).
// A kernel of its
// own: the loop keeps state live across items, which costs the one-split
// kernels registers (and spills in the quantized and head-dim-256 tiles).
struct DecodeWalkWork : DecodeWork {
  static constexpr bool kWalks = true;
  template <int kBlockM>
  __device__ static bool next(const AttentionParams& p, const StepMeta& m, WorkItem& w, int row_step) {
    const int split = w.split + static_cast<int>(gridDim.x);
    if (split >= p.split_slots) return false;
    w = make_split<kBlockM>(p, m, split, row_step);
    return true;
  }
  // A block walks its splits as one key range, the copies running on across
  // each split's end, when each split is a whole number of kBlockN-key tiles:
  // its tiles are then the splits' tiles one after the other, tile t in
  // split w.split + t / split_tiles. Such a block takes a run of consecutive
  // splits (split_run, decode_splits.h: all of them for a block that merges
  // its splits itself, one a pair: decode.cu), not every gridDim.x-th, and
  // writes the lse of its share of the splits past the keys (`empty` the
  // first, then every gridDim.x-th; INT_MAX for none) before its run. Which
  // block computes a split changes none of its bits.
  // Sets w to the block's run (w.split its first split) and returns
  // split_tiles; -1 for a block without a run (w's keys empty); 0, w
  // unchanged, for a walk split by split (also where every block has one
  // split at most: no faster as a run).
  template <int kBlockM, int kBlockN>
  __device__ static int walk_through(const AttentionParams& p, WorkItem& w, int& empty) {
    empty = INT_MAX;
    // A block for every split: split by split, told without the divisions.
    if (writes_partials(p) && p.split_slots <= static_cast<int>(gridDim.x)) return 0;
    const SplitLayout l = split_layout(p, w);
    if (l.split_keys % kBlockN != 0) return 0;
    WorkItem all = w;  // the keys of every split
    set_keys<kBlockM>(p, all, l.range_begin, static_cast<int64_t>(p.split_slots) * l.split_keys);
    const int live = max(1, ceil_div(all.key_end - l.range_begin, l.split_keys));  // split 0 at least
    const int blocks = static_cast<int>(gridDim.x);
    if (writes_partials(p) && live <= blocks) return 0;  // a split a block: as split by split
    const SplitRun run = split_run(live, blocks, static_cast<int>(blockIdx.x));
    if (writes_partials(p)) empty = run.empty;
    if (run.count == 0) {
      set_keys<kBlockM>(p, w, w.seq_len, 0);
      return -1;
    }
    w.split = run.first;
    set_keys<kBlockM>(p, w, l.range_begin + static_cast<int64_t>(run.first) * l.split_keys,
                      static_cast<int64_t>(run.count) * l.split_keys);
    return l.split_keys / kBlockN;
  }
  // A walked split past the sequence's keys writes only its rows' lse (-inf):
  // combine reads no out of such a partial (combine.cuh, kLseGated). Split 0
  // always writes both (it may hold a sink and no key).
  __device__ static bool lse_only(const AttentionParams&, const WorkItem& w, int num_tiles) {
    return num_tiles == 0 && w.split > 0;
  }
};

}  // namespace tileinfer
