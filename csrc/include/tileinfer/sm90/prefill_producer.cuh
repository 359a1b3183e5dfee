// Producer of the Hopper prefill kernel: one warp that walks the scheduler's
// items and moves each item's query tile and its key / value tiles into shared
// memory with the bulk tensor copy engine, kStages tiles ahead of the
// consumers. The consumers take each item from shared memory with its query
// tile (the metadata reads stay off their path from one item to the next).
//
// A key tile of kBlockN positions is kBlockN / box_rows boxes; box b covers
// positions [tile_pos + b * rows, + rows) of one page of one KV head, a dense
// rows x head_dim block of the pool (rows = min(page_size, kBlockN)). Lane b
// looks up box b's page in the block table and issues its copies (one per 64
// columns, for K and for V). Page ids are never trusted: an id outside the
// pool is still a valid copy (the engine fills boxes outside the tensor with
// zeros), and its keys are masked by the consumers (stage_mask).
//
// Positions at or past the item's key end (the sequence's end, or the causal
// bound of the item's last query) must not reach the products: slots past a
// sequence's end hold anything, NaN included, and 0 * NaN is NaN in P V. A
// tile that crosses the key end (at most one per item) is therefore finished
// by the producer: its copies complete on the `tail` barrier, the warp zeroes
// the rows from the key end on, and only then arrives on the stage's full
// barrier (keys and values each). Block-table entries past the key end are
// never read.
//
// A quantized cache (Cfg::kQuant): the warp copies each K and V tile as
// stored (bytes: boxes of {D, rows}, zeros past the head dim and for pages
// outside the pool) into the raw ring, in the same order, K_i then V_i-1;
// with per-vector scales, each slot also gets its tile's k or v scales, which
// the converters multiply the tile by (prefill_scale_range.cuh).
// The converter warps (prefill_convert.cuh) fill the stages from it, zero
// the rows past the key end and those of boxes outside the pool, and
// complete the stages' full barriers; this warp finishes no tail itself.
// A tile whose positions are all the step's own (at or past seq_len -
// q_count) is copied instead from the step's keys and values in fp16
// (p.own_k_map, prefill_own_kv.cuh), once its stage is free, straight into
// the stage (scaled already); its raw slot then carries only the mask (with
// kOwnTile), and the converters only zero its rows. So is a tile wholly
// inside a cached prefix that the pass turned into prefix rows (a chunk
// after a cached prefix, p.pre_base).
#pragma once

#include "../attention_work.cuh"
#include "prefill_scheduler.cuh"
#include "prefill_smem.cuh"

namespace tileinfer {
namespace sm90 {

// The loop over the items that `next` hands out (an inactive item ends it).
template <class Cfg, class NextItem>
__device__ __forceinline__ void produce_items(const PrefillParams& p, const PrefillSmem<Cfg>& sm, NextItem&& next) {
  constexpr int D = Cfg::D;
  constexpr int BM = Cfg::kBlockM;
  constexpr int BN = Cfg::kBlockN;
  constexpr int kBlocks = D / 64;  // 64-column blocks of a row
  const int lane = threadIdx.x & 31;
  const PagedKVParams& kv = p.a.kv;
  const int rows = p.box_rows;
  const int boxes = BN / rows;
  const int page_shift = __ffs(kv.page_size) - 1;  // page sizes are powers of two (checked on the host)
  const uint32_t box_bytes = rows * 128;

  uint32_t tiles = 0;  // tiles produced so far: the ring position
  uint32_t items = 0;  // active items so far: the query ring position
  uint32_t tails = 0;  // tail tiles so far: the tail barrier's phase
  uint32_t raws = 0;   // quantized: raw tiles so far (K and V), the raw ring position
  // Quantized: whether the step's own tiles come from p.own_k_map (read once,
  // after the pass that wrote it: the kernel waits for prior grids first).
  const bool own_kv = Cfg::kQuant && p.own_ok != nullptr && *p.own_ok != 0;
  for (WorkItem w = next(); w.active; w = next()) {

    // The query tile: rows (query, head) of the item's heads, token-major,
    // exactly the box {64, group, BM / group} of q at (head0, first token),
    // into the next query buffer once the consumers are done with it (with
    // two buffers, the item before the last).
    const RingSlot<Cfg::kQBuffers> qs(items++);
    mbar_wait(&sm.q_empty[qs.stage], qs.parity ^ 1);
    if (lane == 0) {
      sm.item[qs.stage] = w;  // released to the consumers by the arrival below
      uint64_t* bar = &sm.q_full[qs.stage];
      mbar_arrive_expect_tx(bar, Cfg::kQBytes);
      const int token0 = w.q_begin + w.row_base / w.group;
#pragma unroll
      for (int c = 0; c < kBlocks; ++c)
        tma_load_3d(sm.q(qs.stage) + c * BM * 128, &p.q_map, bar, 64 * c, w.head0, token0);
    }

    const int num_tiles = w.key_end > w.key_begin ? ceil_div(w.key_end - w.key_begin, BN) : 0;
    // Quantized: the row of the sequence's position 0 when its prefix
    // tiles come from the pass's prefix rows, else -1 (prefill_own_kv.cuh).
    // Read only where the item has a tile wholly before its queries: the
    // first tile's copy would wait for it, on every item of a fresh prompt.
    int prefix_row0 = -1;
    if constexpr (Cfg::kQuant) {
      if (own_kv && p.pre_base != nullptr && w.key_begin + BN <= w.seq_len - w.q_count) {
        const int base = p.pre_base[w.seq];
        if (base >= 0) prefix_row0 = p.a.num_tokens + base;
      }
    }
    // Box `lane`'s page in tile i, -1 for no box. Looked up one tile ahead,
    // so that the block-table read overlaps the wait for a free stage.
    auto lookup = [&](int i) {
      const int pos = w.key_begin + i * BN + lane * rows;
      if (i >= num_tiles || lane >= boxes || pos >= w.key_end) return -1;
      return kv.block_tables[static_cast<int64_t>(w.seq) * kv.max_pages + (pos >> page_shift)];
    };
    // The key (or value) tile i of the item, box `lane` on `page`, into
    // ring position `count`.
    auto load = [&](bool values, int i, uint32_t count, int page) {
      const int tile_pos = w.key_begin + i * BN;
      const int pos = tile_pos + lane * rows;  // box `lane`'s first position
      const bool needed = lane < boxes && pos < w.key_end;
      if constexpr (Cfg::kQuant) {
        const RingSlot<Cfg::kRawSlots> slot(raws++);
        uint64_t* bar = &sm.raw_full[slot.stage];
        mbar_wait(&sm.raw_empty[slot.stage], slot.parity ^ 1);
        const bool in_pool = page_in_pool(kv, page);
        const uint32_t outside = __ballot_sync(0xffffffffu, needed && !in_pool);
        const uint32_t issued = __popc(__ballot_sync(0xffffffffu, needed));
        const int own_begin = w.seq_len - w.q_count;  // the step's first position
        // A tile of the step's own positions, or one wholly in prefix rows.
        const bool own = own_kv && (tile_pos >= own_begin || (prefix_row0 >= 0 && tile_pos + BN <= own_begin));
        // Per-vector scales: the slot also takes its tile's scales (k or v),
        // plain bulk copies (no bounds: boxes on pages inside the pool only;
        // the converters take no scale for the others' rows).
        const bool scaled = Cfg::kVectorScales && !own && needed && in_pool;
        const uint32_t scaled_boxes = __popc(__ballot_sync(0xffffffffu, scaled));
        uint8_t* stage = nullptr;
        if (own) {
          const RingSlot<Cfg::kStages> st(count);
          mbar_wait(&(values ? sm.empty_v : sm.empty_k)[st.stage], st.parity ^ 1);
          stage = values ? sm.v(st.stage) : sm.k(st.stage);
        }
        if (lane == 0) {
          sm.raw_mask[slot.stage] = outside | (own ? kOwnTile : 0u);  // released by the arrival below
          mbar_arrive_expect_tx(bar, (own ? Cfg::kTileBytes : issued * rows * D) + scaled_boxes * rows * 4);
        }
        __syncwarp();
        const int in_page = pos & (kv.page_size - 1);
        if (own) {
          if (lane < kBlocks)
            tma_load_3d(stage + lane * BN * 128, values ? &p.own_v_map : &p.own_k_map, bar, 64 * lane, w.kv_head,
                        tile_pos < own_begin ? prefix_row0 + tile_pos : w.q_begin + (tile_pos - own_begin));
        } else if (needed) {
          tma_load_4d(sm.raw_tile(slot.stage) + lane * rows * D, values ? &p.v_map : &p.k_map, bar, 0, in_page,
                      w.kv_head, page);
        }
        if (scaled) {
          const int at = pool_row_on_page(kv, page, w.kv_head, pos);  // (in the pool: not -1)
          bulk_load(sm.raw_scales(slot.stage) + lane * rows, (values ? kv.v_scale : kv.k_scale) + at, rows * 4, bar);
        }
        return;
      }
      const RingSlot<Cfg::kStages> slot(count);
      mbar_wait(&(values ? sm.empty_v : sm.empty_k)[slot.stage], slot.parity ^ 1);
      uint64_t* full = &(values ? sm.full_v : sm.full_k)[slot.stage];
      uint8_t* tile = values ? sm.v(slot.stage) : sm.k(slot.stage);
      const uint32_t issued = __popc(__ballot_sync(0xffffffffu, needed));
      const bool tail = tile_pos + BN > w.key_end;
      uint64_t* bar = tail ? sm.tail : full;
      if (!values) {
        // Read by the consumers between their wait on full_k and their release of empty_k.
        const uint32_t outside = __ballot_sync(0xffffffffu, needed && !page_in_pool(kv, page));
        if (lane == 0) sm.stage_mask[slot.stage] = outside;
      }
      if (lane == 0) mbar_arrive_expect_tx(bar, issued * kBlocks * box_bytes);
      __syncwarp();
      if (needed) {
        const int in_page = pos & (kv.page_size - 1);
#pragma unroll
        for (int c = 0; c < kBlocks; ++c)
          tma_load_4d(tile + c * BN * 128 + lane * rows * 128, values ? &p.v_map : &p.k_map, bar, 64 * c, in_page,
                      w.kv_head, page);
      }
      if (tail) {
        mbar_wait(sm.tail, tails & 1);
        ++tails;
        // Zero rows [key_end - tile_pos, BN): 128 contiguous bytes per row and
        // 64-column block (the swizzle only permutes inside them). One loop
        // per block: the producer waits here for the item's tail copies, and
        // a division by the run-time chunk count per chunk (one loop over all
        // blocks) made this loop the pace of short prompts.
        const int first = w.key_end - tile_pos;
        const int chunks = (BN - first) * 8;  // 16-byte chunks of one block's rows
#pragma unroll
        for (int c = 0; c < kBlocks; ++c) {
          uint8_t* rows_past = tile + c * BN * 128 + first * 128;
          for (int x = lane; x < chunks; x += 32)
            *reinterpret_cast<uint4*>(rows_past + x * 16) = make_uint4(0, 0, 0, 0);
        }
        wgmma::fence_proxy_async_smem();  // the zeros, visible to the tensor cores
        __syncwarp();
        if (lane == 0) mbar_arrive(full);
      }
    };
    // Keys of tile i, then values of tile i - 1: the consumers release a key
    // tile as soon as its S product completes, long before the values that
    // go with it, so the next keys can land while those values are in use.
    int page = lookup(0);
    int prev_page = -1;
    for (int i = 0; i < num_tiles; ++i) {
      const int next_page = lookup(i + 1);
      load(false, i, tiles + i, page);
      if (i > 0) load(true, i - 1, tiles + i - 1, prev_page);
      prev_page = page;
      page = next_page;
    }
    if (num_tiles > 0) load(true, num_tiles - 1, tiles + num_tiles - 1, prev_page);
    tiles += num_tiles;
  }
  // No item left: an inactive item, once the consumers are done with the last query tile.
  const RingSlot<Cfg::kQBuffers> qs(items);
  mbar_wait(&sm.q_empty[qs.stage], qs.parity ^ 1);
  if (lane == 0) {
    sm.item[qs.stage].active = false;
    mbar_arrive(&sm.q_full[qs.stage]);
  }
}

// The producer warp: the scheduler's order, or (kHandOut: a mixed step beside
// its decodes) the run-time hand-out (prefill_scheduler.cuh). The hand-out is
// a kernel of its own: its state beside the copy loop would take registers
// that the order's loop needs (with both loops in one kernel, at 40
// registers a thread, both spilled).
template <class Cfg, bool kHandOut>
__device__ __forceinline__ void prefill_produce(const PrefillParams& p, const PrefillSmem<Cfg>& sm,
                                                const PrefillScheduler& sched) {
  constexpr int BM = Cfg::kBlockM;
  auto hand_out = [&](HandOutCursor& cursor) {
    cursor.reset();
    produce_items<Cfg>(p, sm, [&] { return sched.template take_item<BM>(p, cursor); });
  };
  if constexpr (kHandOut && Cfg::kQuant) {
    hand_out(*sm.cursor);  // in the kernel's buffer (prefill_tile.h, kCursorBytes)
  } else if constexpr (kHandOut) {
    __shared__ HandOutCursor cursor;
    hand_out(cursor);
  } else {
    int round = -1;  // next_item sets it to the place of the item it returns
    produce_items<Cfg>(p, sm, [&] { return sched.template next_item<BM>(p, ++round); });
  }
}

}  // namespace sm90
}  // namespace tileinfer
