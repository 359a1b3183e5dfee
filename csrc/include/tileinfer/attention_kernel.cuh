// The tensor-core attention kernel over the paged cache (bf16 / fp16), shared by
// prefill and decode: FlashAttention-2's structure, with the work mapping
// (attention_work.cuh) as a template parameter.
//
// A block of 4 warps holds a tile of query rows and walks its key positions one
// key tile (kBlockN positions: part of a page, one page, or several) at a time:
//   1. the pool row of every key of a tile is looked up through the block table
//      (one int per key, in shared memory, kStages tiles ahead);
//   2. K and V of the tile are copied into shared memory with 16-byte cp.async,
//      kStages deep, zero-filled for skipped keys (past the end, bad page ids);
//   3. each warp computes S = Q K^T for its 16 * kRowTiles rows x kWarpN keys
//      (mma.sync m16n8k16, fp32 accumulate), masked only when the tile overlaps
//      the causal diagonal or holds a skipped key;
//   4. online softmax (softmax.cuh; scale * log2(e) folded into exp2), P rounded
//      to the element type, O += P V.
// Warps are laid out kWarpsM (row groups) x kWarpsN (key slices of a tile):
// prefill uses 4 x 1 (64 or 128 rows: csrc/ops/prefill.cu says when); decode,
// whose packed tile is often a single 16-row tile, uses 1 x 4, and the four
// warps' softmax states and accumulators are merged through shared memory at
// the end (flash-decoding inside the block).
// The epilogue normalizes, stages the output in shared memory as fp32 and writes
// 16-byte vectors: `out` (prefill) or the fp32 partial (decode), plus the lse.
// The body below wires the roles, each in its own file:
//   tile_config.cuh    the tile's shape (TileConfig) and its swizzle
//   tile_smem.cuh      the shared-memory layout
//   tile_io.cuh        block-table lookups, K / V tile copies, query rows in
//   tile_query.cuh     queries over a quantized cache (int8 planes, fp16)
//   tile_products.cuh  S = Q K^T and O += P V per cache type
//   tile_mask.cuh      which scores of a tile are hidden
//   softmax.cuh        the online softmax (shared with the Hopper kernel)
//   tile_epilogue.cuh  the key-slice merge, normalization and stores
//
// INT8 cache (CacheT = int8_t): the int8 tiles and their
// per-key fp32 scales are copied as above (half the bytes); no dequantized
// copy is made. A key's scale multiplies its column of scores, a value's scale
// its probabilities before P is rounded for the P V product, and queries are
// multiplied by the keys' smoothing factors when they are staged (which undoes
// the smoothing in the scores).
// - Scores on the integer tensor cores (mma m16n8k32 s8): the keys are read
//   from their staged tile as they are, and each query row becomes a 15-bit
//   integer, q * smooth * 2^e rounded, 2^e putting the row's largest |value| in
//   [2^13, 2^14), held as two int8 planes (q = 256 hi + lo). Two products give
//   the exact integer dot product, which 2^-e turns back into a score. Per
//   row, so a head of small queries next to a large one keeps its bits; at
//   the row's maximum a 15-bit step is 8 times finer than fp16's. The int8
//   decode loop is instruction-bound, and this removes the key conversion
//   (int8 -> fp16 into shared memory, then ldmatrix) from it.
// - P V in fp16: values are converted exactly to fp16 (int8.cuh), the stored
//   integers, not dequantized values: in decode straight from the staged tile
//   into B fragments (TileConfig::kValuesInRegs), in prefill once per tile into
//   a shared fp16 tile that all warps read. fp16, whatever q's type (QT):
//   the int8 -> fp16 conversion takes half the instructions of int8 -> bf16,
//   and fp16 keeps 3 more mantissa bits. Its range is handled by a power of
//   two: each warp's probabilities are multiplied by v_scale * 2^15 / vmax,
//   vmax being the largest |v_scale| seen so far (a running maximum; the
//   accumulator is rescaled when it grows, the epilogue multiplies it back). So
//   P * v_scale stays below fp16's maximum, and the 2^15 of headroom keeps it
//   out of fp16's subnormals down to 2^-29 of vmax: one key with a huge value
//   scale (an attention sink's large values, say) does not wipe out the
//   precision of all the others.
// A query row holding inf or NaN (after smoothing) gets NaN output and lse.
//
// FP8 cache (CacheT = __nv_fp8_e4m3): the same path as int8 (quant.cuh holds
// what differs), with fp32 scales per vector or one per tensor (copied per key
// as if per vector, from one address). Values as above (e4m3 -> fp16 is exact,
// fp8.cuh). Scores in fp16 instead of integers: each query row, q * smooth *
// 2^e with the same per-row 2^e, is staged as fp16 (its largest value in
// [2^13, 2^14): no overflow, and fp16's 11 bits beside bf16 queries' 8), the
// keys converted in registers right after their ldmatrix, and m16n8k16
// products accumulate in fp32. The staged query columns are permuted so that
// the converted key fragments need no shuffle (tile_query.cuh, tile_products.cuh).
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "attention_work.cuh"
#include "common.cuh"
#include "quant.cuh"
#include "mma.cuh"
#include "params.h"
#include "softmax.cuh"
#include "tile_config.cuh"
#include "tile_epilogue.cuh"
#include "tile_io.cuh"
#include "tile_mask.cuh"
#include "tile_products.cuh"
#include "tile_query.cuh"
#include "tile_smem.cuh"

namespace tileinfer {

// The block's rows: its row tile, or row tile `row_step` of a block that
// walks them (Work::kRowWalk, attention_work.cuh). Returns whether it walks
// on to a next row tile.
template <class Cfg, class Work>
__device__ __forceinline__ bool attention_tile_rows(const AttentionParams& p, int row_step) {
  using T = typename Cfg::T;
  using QT = typename Cfg::QT;  // also the output's element type
  // The quantized cache's conversions (a placeholder for the others, whose code never uses it).
  using QCacheT = std::conditional_t<Cfg::kQuant, typename Cfg::CacheT, int8_t>;
  constexpr int D = Cfg::D;
  constexpr int BM = Cfg::kBlockM;
  constexpr int BN = Cfg::kBlockN;
  constexpr int WN = Cfg::kWarpN;
  constexpr int S = Cfg::kStages;
  constexpr int kSlots = Cfg::kRowSlots;

  extern __shared__ __align__(128) uint8_t smem[];
  const TileSmem<Cfg> sh(smem);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warp_m = warp % Cfg::kWarpsM;
  const int warp_n = warp / Cfg::kWarpsM;
  const int page_shift = __ffs(p.kv.page_size) - 1;  // page sizes are powers of two (checked on the host)
  const uint8_t* k_pool = static_cast<const uint8_t*>(p.kv.k_cache);
  const uint8_t* v_pool = static_cast<const uint8_t*>(p.kv.v_cache);

  // Early reads (decode, bf16 / fp16 cache): the block's work, row table and
  // first lookups come from the step's metadata and its first tiles'
  // block-table entries read before the block waits for the previous kernel
  // (programmatic launches, common.cuh), while that kernel ends; no kernel of
  // this package writes them. Only the wait makes the previous kernel's
  // writes visible, so a programmatic launch (p.programmatic) reads the same
  // values again right after the wait, issues its first copies, and a block
  // that then finds any of them changed drains the copies and starts over
  // from the values read after the wait. A plain launch starts after the
  // previous kernel has ended: nothing to read again. The early reads are
  // ordinary loads: the PTX ISA makes the previous grid's writes visible to
  // the current grid after griddepcontrol.wait, whatever it read before, so
  // a line they left in L1 cannot answer a later load with an old value (and
  // the second reads go to L2 anyway). As ld.global.cg they cost a plain
  // launch about 0.5 us on the H200. Prefill and the int8 tiles wait first
  // (with the check, the int8 kernels spilled registers).
  constexpr bool kEarly = Work::kReadsAhead && !Cfg::kQuant;
  TILEINFER_STAMP(0);
  if constexpr (!kEarly) wait_for_prior_grids();
  StepMeta meta = Work::read_meta(p);
  WorkItem w;
  int num_tiles = 0;
  // A walking block given no partials (one block per (sequence, KV head):
  // decode.cu) merges its splits itself, in split order, as combine would
  // have merged their partials (split_merge.cuh). (Read from the parameters
  // where it is used, rather than held in a register through the loop.)
  constexpr bool kCanMerge = Work::kWalks && Cfg::kMergesSplits;
  const auto merges = [&] {
    if constexpr (kCanMerge) {
      return !Work::writes_partials(p);
    } else {
      return false;
    }
  };
  // A walking block, merging or not, walks a run of its splits as one key
  // range where each split is a whole number of tiles
  // (DecodeWalkWork::walk_through): split_tiles tiles a split, 0 for a walk
  // split by split. The copies then run on across a split's end, whose rows
  // go through the stage of its last tile into the merge or the split's
  // partial (split_walk_boundary): for 16-bit caches, whose stage holds them,
  // up to head dim 128 (d 256's key-slice tile spilled 92 bytes with it).
  constexpr bool kWalkThrough =
      Work::kWalks && !Cfg::kQuant && D <= 128 && Cfg::kWarpsN * BM * D * 4 <= 2 * Cfg::kTileBytes;
  int split_tiles = 0;
  int empty = INT_MAX;  // walk_through: this block's first split past the keys (lse only)
  int first_entries[S];  // block-table entries of this thread's keys of the first tiles
  const KeyTiles<BN, S, kSlots> keys{p.kv, w, tid, page_shift, sh.key_rows, sh.flags, sh.entries,
                                     p.kv.head_dim * static_cast<int>(sizeof(typename Cfg::CacheT))};
  // The item's key tiles, row table and first block-table lookups (barrier after).
  auto prepare = [&] {
    num_tiles = w.active && w.key_end > w.key_begin ? ceil_div(w.key_end - w.key_begin, BN) : 0;
    write_row_table<BM, Cfg::kThreads>(w, tid, sh.row_token, sh.row_head, sh.row_qpos);
    keys.first_entries(first_entries, num_tiles);
  };
  auto start = [&] {  // the block's (first) work item from `meta`
    w = Work::template make<BM>(p, meta, row_step);
    if constexpr (kWalkThrough) split_tiles = Work::template walk_through<BM, BN>(p, w, empty);
    prepare();
  };
  auto finish_lookups = [&] { keys.lookup_entries(first_entries, num_tiles); };
  start();
  TILEINFER_STAMP(1);  // metadata read, first entries in flight
  // 16-bit rows on the d 128 tile: short rows where skips_pads holds (head
  // dim 96) leave the zero chunks past them to zero_pads (tile_io.cuh). Not
  // the 64-row walking tile: at 253 registers it spilled with it.
  constexpr bool kPadsZeroed =
      sizeof(typename Cfg::CacheT) == 2 && Cfg::kCacheChunks == 16 && !(Work::kWalks && BM > 16);
  const auto stage_at = [](int row, int ch) { return Cfg::stage_offset(row, ch); };  // a staged tile's chunks
  auto load_tile = [&](int tile) {
    uint8_t* k_dst = sh.kv + (tile % S) * 2 * Cfg::kTileBytes;
    uint8_t* v_dst = k_dst + Cfg::kTileBytes;
    keys.template copy_kv<Cfg::kThreads, Cfg::kCacheChunks, Cfg::kRowBytes, Cfg::kKeySlices, kPadsZeroed>(
        tile, k_pool, v_pool, k_dst, v_dst, stage_at);
    if constexpr (Cfg::kQuant) {
      // A pool row is also the index of its scale ([num_pages, num_kv_heads,
      // page_size]). A per-tensor scale (fp8) is stored for every key from
      // one cached load: 4-byte copies of one address from every thread cost
      // more than the key bytes they go with.
      if (tid < BN) {
        const int pr = sh.key_rows[(tile % kSlots) * BN + tid];
        float* dst = sh.scale + (tile % S) * 2 * BN;
        if (p.kv.scale_per_tensor) {
          dst[tid] = pr >= 0 ? __ldg(p.kv.k_scale) : 0.f;
          dst[BN + tid] = pr >= 0 ? __ldg(p.kv.v_scale) : 0.f;
        } else {
          cp_async_4(dst + tid, p.kv.k_scale + (pr < 0 ? 0 : pr), pr >= 0);
          cp_async_4(dst + BN + tid, p.kv.v_scale + (pr < 0 ? 0 : pr), pr >= 0);
        }
      }
    }
  };

  // Queries over a quantized cache go through registers (tile_query.cuh);
  // decode's few rows leave with the block-table reads.
  QuantQueries<Cfg> qq;
  if constexpr (Cfg::kQuant) qq.load_ahead(p, w, tid);
  finish_lookups();
  __syncthreads();  // row table and the first lookups
  auto issue_first_copies = [&] {
    if constexpr (kPadsZeroed) {
      keys.template zero_pads<Cfg::kThreads, Cfg::kCacheChunks, Cfg::kRowBytes>(sh.kv, 2 * S, stage_at);
    }
    if constexpr (!Cfg::kQuant) {
      copy_query_rows<BM, Cfg::kThreads, Cfg::kChunks, T>(
          p, sh.row_token, sh.row_head, sh.q, tid, [](int row, int ch) { return int(sizeof(T)) * Cfg::swz(row, ch); });
    }
    cp_async_commit();
#pragma unroll
    for (int j = 0; j < S - 1; ++j) {
      if (j < num_tiles) load_tile(j);
      cp_async_commit();  // empty groups keep the group count uniform
    }
  };
  if constexpr (kEarly) {
    wait_for_prior_grids();
    // The second reads leave first: behind the copies they would wait for
    // every block's first wave of them.
    StepMeta now = meta;
    int entries_now[S];
    if (p.programmatic) {
      now = Work::template read_meta<true>(p);
      keys.template first_entries<true>(entries_now, num_tiles);
    }
    TILEINFER_STAMP(2);  // waited
    if (w.active) issue_first_copies();  // block-uniform
    if (p.programmatic) {
      bool changed = now != meta;
#pragma unroll
      for (int j = 0; j < S; ++j) changed |= entries_now[j] != first_entries[j];
      if (__syncthreads_or(changed)) {
        cp_async_wait<0>();
        __syncthreads();  // stages, row table and key slots free again
        meta = now;
        start();
        finish_lookups();
        __syncthreads();
        if (w.active) issue_first_copies();
      }
    }
  } else {
    TILEINFER_STAMP(2);  // first block-table entries read
    if (w.active) issue_first_copies();
  }
  // Marked after the first copies (meta holds where the padding begins: a
  // load of its own would have waited for the copies, or delayed them).
  Work::template mark_padding_rows<QT>(p, meta.padding_begin);
  // Row tiles past an inactive one are inactive too (they start further
  // past the sequence's rows, or the sequence is the other kernel's).
  if (!w.active) return false;  // block-uniform
  // Whether the block walks on to its next row tile, which holds rows.
  const auto more_rows = [&] { return Work::kRowWalk && w.row_base + BM < w.q_count * w.group; };
  if constexpr (kWalkThrough) {
    if (split_tiles != 0) {  // block-uniform: the empty splits this block gives their lse, then its run, if any
      for (WorkItem e = w; empty < p.split_slots; empty += gridDim.x) {
        e.split = empty;
        tile_neutral_lse<Cfg, Work>(p, e, sh, tid);
      }
      if (split_tiles < 0) {
        cp_async_wait<0>();  // (the query rows' copy)
        return more_rows();
      }
    }
  }
  if (merges()) split_merge_start<Cfg>(sh, tid);
  // A block's work items: one, or (DecodeWalkWork) the splits it walks in
  // turn, each with its own prologue, key loop and epilogue, or all of them
  // in one key loop (split_tiles > 0); the rows stay the same.
  for (;;) {
    if (Work::lse_only(p, w, num_tiles)) {
      // Splits past a sequence's keys are its last ones: this block's later
      // splits hold no key either, and get their lses here, all at once
      // (a merging block skips them, as combine skips a partial of lse -inf).
      cp_async_wait<0>();  // (the first item's query copy)
      if constexpr (kCanMerge) {
        if (merges()) {
          split_merge_finish<Cfg>(p, sh, tid);
          return more_rows();
        }
      }
      do {
        tile_neutral_lse<Cfg, Work>(p, w, sh, tid);
      } while (Work::template next<BM>(p, meta, w, row_step));
      return more_rows();
    }
    // Tree verify: each row's word, read once, after the wait (the mask may come
    // from the previous kernel); the barrier before the key loop publishes it.
    if constexpr (Work::kTree) {
      for (int r = tid; r < BM; r += Cfg::kThreads) sh.row_tree[r] = tree_word(p, sh.row_token[r]);
    }
    if constexpr (Cfg::kQuant) qq.stage(p, w, sh, tid);
    // This lane's rows: g and g + 8 of each of its warp's 16-row tiles (g = lane / 4);
    // local row index R = 2 * mt + r is row warp_m * kWarpRows + 16 mt + g + 8 r.
    constexpr int kR = 2 * Cfg::kRowTiles;
    auto row_of = [&](int R) { return warp_m * Cfg::kWarpRows + 16 * (R >> 1) + (lane >> 2) + 8 * (R & 1); };
    int qpos[kR];
    int qmin = INT_MAX;  // first query position of the warp's rows
    int qmax = INT_MIN;  // last one (padding rows excluded)
#pragma unroll
    for (int R = 0; R < kR; ++R) {
      qpos[R] = sh.row_qpos[row_of(R)];
      qmin = min(qmin, qpos[R]);
      qmax = max(qmax, qpos[R] == INT_MAX ? INT_MIN : qpos[R]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      qmin = min(qmin, __shfl_xor_sync(0xffffffffu, qmin, o));
      qmax = max(qmax, __shfl_xor_sync(0xffffffffu, qmax, o));
    }
    const bool warp_has_rows = qmax != INT_MIN;
    // First key a tree mask can hide (INT_MAX: none): tiles before it skip the test.
    const int tree_from = Work::kTree ? tree_first_key(p, w) : INT_MAX;

    cp_async_wait<S - 1>();  // the Q group (committed first) has landed
    __syncthreads();
    // ldmatrix row addresses (bytes, shared space). Q (A operand) and V (B
    // operand, transposed): lane l reads row l % 16 of a 16-row block, chunk
    // 2m + l / 16; K (B operand): key 8 (l / 16) + l % 8, chunk 2m + (l / 8) % 2.
    // The chunks are 16 bytes: 8 elements of T, or 16 of int8 (the int8 queries'
    // planes and the staged int8 keys, rows swizzled as the staged cache rows).
    const SwizzleCols cols_a(lane >> 4, lane & 7);
    const SwizzleCols cols_k((lane >> 3) & 1, lane & Cfg::kStageSwizzle);
    const SwizzleCols cols_q8(lane >> 4, lane & Cfg::kStageSwizzle);  // also the int8 V rows (transposed)
    const int a_row = warp_m * Cfg::kWarpRows + (lane & 15);  // Q row of this lane's ldmatrix address
    const uint32_t q_row = smem_addr(sh.q) + (Cfg::kInt8 ? 1 : 2) * a_row * D;
    const int key0 = warp_n * WN;  // this warp's keys within a tile: [key0, key0 + WN)
    const int k_row = (key0 + (lane >> 4) * 8 + (lane & 7)) * D;  // elements, within a K tile
    const int v_row = (key0 + (lane & 15)) * D;                   // elements, within a V tile
    const uint32_t conv_base = smem_addr(sh.conv);

    // Quantized prefill: converts a staged V tile to T, all warps together.
    auto convert_tile = [&](const uint8_t* src, T* dst) {
      constexpr int kGroupThreads = 32 * Cfg::kWarpsM;
      const int gt = warp_m * 32 + lane;
#pragma unroll
      for (int it = 0; it < WN * Cfg::kCacheChunks / kGroupThreads; ++it) {
        const int idx = gt + it * kGroupThreads;
        const int row = idx % WN;  // consecutive lanes: consecutive rows, no bank conflicts either side
        const int ch = idx / WN;   // 16 int8 = chunks 2 ch, 2 ch + 1 of the converted row
        uint4 lo, hi;
        x16_to_half<QCacheT>(*reinterpret_cast<const uint4*>(src + Cfg::stage_offset(row, ch)), lo, hi);
        *reinterpret_cast<uint4*>(dst + Cfg::swz(row, 2 * ch)) = lo;
        *reinterpret_cast<uint4*>(dst + Cfg::swz(row, 2 * ch + 1)) = hi;
      }
    };

    // A fragment of Q for row tile mt: 16 rows x columns 16 kk.. (T), or for
    // int8 f = 2 kk + h, plane h (0: hi, 1: lo) of columns 32 kk...
    auto q_frag_smem = [&](uint32_t (&a)[4], int mt, int f) {
      if constexpr (Cfg::kInt8) {
        ldmatrix_x4(a, q_row + (f & 1) * BM * D + mt * 16 * D + 2 * cols_q8(f >> 1));
      } else {
        ldmatrix_x4(a, q_row + 2 * (mt * 16 * D + cols_a(f)));
      }
    };
    uint32_t qf[Cfg::kQInRegs ? Cfg::kRowTiles : 1][Cfg::kQInRegs ? D / 16 : 1][4];
    if constexpr (Cfg::kQInRegs) {
#pragma unroll
      for (int mt = 0; mt < Cfg::kRowTiles; ++mt)
#pragma unroll
        for (int f = 0; f < D / 16; ++f) q_frag_smem(qf[mt][f], mt, f);
    }
    // With a positive scale the softmax takes raw scores and folds the scale into
    // its exp2 argument (one FFMA per score); a soft-cap folds cap * log2(e)
    // instead (softmax.cuh).
    const ScoreMap smap = ScoreMap::make(p.scale, p.soft_cap);
    // Quantized: this lane's rows' 2^-e (scores come out of the products in
    // units of 2^e) times the score map's factor (scale / cap, or an unfoldable
    // scale: one multiply per score fewer, and a register fewer in the 128-row
    // tile), and whether a row holds a non-finite value.
    float row_unscale[Cfg::kQuant ? kR : 1];
    bool row_bad[Cfg::kQuant ? kR : 1];
    if constexpr (Cfg::kQuant) {
#pragma unroll
      for (int R = 0; R < kR; ++R) {
        // The factor times a power of two.
        row_unscale[R] = smap.pre_factor() / QuantQueries<Cfg>::row_scale(sh, row_of(R));
        row_bad[R] = isinf(__int_as_float(sh.row_qmax[row_of(R)]));
      }
    }

    OnlineSoftmax<kR, 4> sm;  // each row spread over the 4 lanes of a quad
    // A sink (in the blocks Work says hold it) joins the row in the epilogue
    // (tile_epilogue.cuh), after its keys.
#pragma unroll
    for (int R = 0; R < kR; ++R) sm.row[R].init();
    float o[kR][D / 4];  // O row R; column 8j + 2(lane % 4) + e at [2j + e] (int8 decode: tile_pv)
#pragma unroll
    for (int R = 0; R < kR; ++R)
#pragma unroll
      for (int x = 0; x < D / 4; ++x) o[R][x] = 0.f;
    // int8: the warp's running maximum of |value scale|, and the probabilities' factor 2^15 / vmax.
    float vmax = 0.f, p_factor = 0.f;
    const int quad = lane & 3;

    int split_end = split_tiles > 0 ? split_tiles : INT_MAX;  // the tile that starts the next split
    for (int i = 0; i < num_tiles; ++i) {
      cp_async_wait<S - 2>();  // tile i has landed (this thread's copies) ...
      __syncthreads();         // ... everyone's, and everyone is done with tile i - 1
      if (i == 0) TILEINFER_STAMP(3);  // first tile landed
      if constexpr (kWalkThrough) {
        if (i == split_end) {  // block-uniform: a split ends with tile i - 1, whose stage is free
          uint8_t* freed = sh.kv + ((i - 1) % S) * 2 * Cfg::kTileBytes;  // tile i - 1's stage
          split_walk_boundary<Cfg, Work>(p, w, sh, sm, o, reinterpret_cast<float*>(freed), tid, warp_n, quad, row_of,
                                         merges());
          // The rows staged there covered the pad chunks that the copies of a
          // short head dim leave alone (tile_io.cuh, zero_pads).
          if constexpr (kPadsZeroed) {
            keys.template zero_pads<Cfg::kThreads, Cfg::kCacheChunks, Cfg::kRowBytes>(freed, 2, stage_at);
          }
          ++w.split;  // (the sink joins split 0 only)
          split_end += split_tiles;
#pragma unroll
          for (int R = 0; R < kR; ++R) {
            sm.row[R].init();
#pragma unroll
            for (int x = 0; x < D / 4; ++x) o[R][x] = 0.f;
          }
        }
      }
      if (i + S - 1 < num_tiles) load_tile(i + S - 1);  // into the stage tile i - 1 used
      cp_async_commit();
      if (i + S < num_tiles) keys.lookup(i + S);  // into the slot tile i - 1 used

      const uint8_t* k_stage = sh.kv + (i % S) * 2 * Cfg::kTileBytes;
      const uint8_t* v_stage = k_stage + Cfg::kTileBytes;
      // Before the skip below: all warps convert the tile together.
      if constexpr (Cfg::kQuant && !Cfg::kValuesInRegs) {
        convert_tile(v_stage, sh.conv);
        __syncthreads();
      }

      const int tile_pos = w.key_begin + i * BN;  // position of the tile's key 0
      // Warp-uniform: nothing visible. (The key walk starts at the window of
      // the block's first query; the warps of later rows do not skip the tiles
      // before their own windows: that test keeps a register live through the
      // loop, and the 128-row int8 tile has none to spare.)
      if (!warp_has_rows || (p.causal && tile_pos + key0 > qmax)) continue;

      const uint32_t v_tile = Cfg::kQuant && !Cfg::kValuesInRegs ? conv_base : smem_addr(v_stage);

      // S = Q K^T: s[R][2j + e] is row R, key key0 + 8j + 2(lane % 4) + e.
      float s[kR][WN / 4];
      // A fragments of k-step kk (f: fragment index, see q_frag_smem).
      auto q_frags = [&](uint32_t (&a)[Cfg::kRowTiles][4], int f) {
#pragma unroll
        for (int mt = 0; mt < Cfg::kRowTiles; ++mt) {
          if constexpr (Cfg::kQInRegs) {
#pragma unroll
            for (int x = 0; x < 4; ++x) a[mt][x] = qf[mt][f][x];
          } else {
            q_frag_smem(a[mt], mt, f);
          }
        }
      };
      tile_scores<Cfg>(s, k_stage, k_row, cols_k, q_frags, row_unscale);
      // Quantized: this lane's key scales (keys key0 + 8j + 2 quad + e at [j][e]; 0 for
      // skipped keys), and the multiplication of score / probability columns by them.
      const float* tile_scales = sh.scale + (i % S) * 2 * BN + key0 + 2 * quad;
      auto lane_scales = [&](const float* scales, float (&f)[WN / 8][2]) {
#pragma unroll
        for (int j = 0; j < WN / 8; ++j) {
          const float2 f2 = *reinterpret_cast<const float2*>(scales + 8 * j);
          f[j][0] = f2.x;
          f[j][1] = f2.y;
        }
      };
      auto scale_columns = [&](const float (&f)[WN / 8][2]) {
#pragma unroll
        for (int j = 0; j < WN / 8; ++j)
#pragma unroll
          for (int R = 0; R < kR; ++R) {
            s[R][2 * j] *= f[j][0];
            s[R][2 * j + 1] *= f[j][1];
          }
      };
      if constexpr (Cfg::kQuant) {  // each key's scale multiplies its column of scores (skipped keys masked below)
        float ks[WN / 8][2];
        lane_scales(tile_scales, ks);
        scale_columns(ks);
      }
      // Soft-cap (or an unfoldable scale), on the true products. (int8: the
      // factor is in row_unscale already, the key scales multiply the product.)
      if constexpr (Cfg::kQuant) {
        smap.apply_premultiplied(s);
      } else {
        smap.apply(s);
      }

      mask_tile<Cfg>(s, p, sh, i, tile_pos, key0, quad, qpos, qmin, tree_from, row_of);

      float factor[kR];
      sm.update(s, smap.k, factor);  // s now holds the probabilities
      // Quantized: each value's scale, divided by the warp's running vmax (of |scale|), multiplies
      // its probabilities (after the row sums took them); a larger vmax rescales
      // the accumulator like a larger row maximum does.
      if constexpr (Cfg::kQuant) {
        float vs[WN / 8][2];
        lane_scales(tile_scales + BN, vs);
        float tile_vmax = 0.f;
#pragma unroll
        for (int j = 0; j < WN / 8; ++j) tile_vmax = fmaxf(tile_vmax, fmaxf(fabsf(vs[j][0]), fabsf(vs[j][1])));
        tile_vmax = warp_max<4>(tile_vmax);  // a quad holds all the warp's keys (each quad the same)
        if (tile_vmax > vmax) {  // warp-uniform
          const float next = fmaxf(tile_vmax, 0x1p-100f);  // keeps 2^15 / vmax finite for subnormal scales
          const float grow = vmax / next;
#pragma unroll
          for (int R = 0; R < kR; ++R) factor[R] *= grow;
          vmax = next;
          p_factor = kProbHeadroom * (1.f / vmax);  // a reciprocal, not a full division (registers)
        }
#pragma unroll
        for (int j = 0; j < WN / 8; ++j) {
          vs[j][0] *= p_factor;
          vs[j][1] *= p_factor;
        }
        scale_columns(vs);
      }
      // Rescale the accumulator only when some row's maximum (or vmax) grew: in
      // long decode walks most tiles leave every factor at exactly 1.
      bool rescale = false;
#pragma unroll
      for (int R = 0; R < kR; ++R) rescale |= factor[R] != 1.f;
      if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
        for (int R = 0; R < kR; ++R)
#pragma unroll
          for (int x = 0; x < D / 4; ++x) o[R][x] *= factor[R];
      }

      // O += P V, P rounded to the element type; keys 16kk.. of the warp's slice.
      tile_pv<Cfg>(o, s, v_tile, v_row, cols_a, cols_q8);
    }

    // ---- Epilogue ----
    // The next kernel (combine) may be scheduled once every block is here, not
    // at their start: blocks of a next decode step resident early, beside this
    // grid, took SM slots unevenly (H200: d 64, 32 x 4k, 64.8 -> 72.0 us).
    TILEINFER_STAMP(4);  // key loop done
    if (!more_rows()) allow_dependent_launch();
    tile_epilogue<Cfg, Work>(p, w, sh, sm, o, vmax, row_bad, tid, warp_n, quad, row_of, merges());
    if constexpr (!Work::kWalks) return more_rows();  // (no loop: the one-split kernels keep their registers)
    if (split_tiles > 0 || !Work::template next<BM>(p, meta, w, row_step)) {
      if constexpr (kCanMerge) {
        if (merges()) split_merge_finish<Cfg>(p, sh, tid);
      }
      return more_rows();
    }
    __syncthreads();  // the item's shared memory (rows, stages, epilogue rows) is free
    prepare();
    finish_lookups();
    __syncthreads();
    if (num_tiles > 0) issue_first_copies();
  }
}

template <class Cfg, class Work>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) attention_tile_kernel(const __grid_constant__ AttentionParams p) {
  if constexpr (Work::kRowWalk) {
    // Its own instantiation: around the other kernels' bodies the loop cost
    // up to 58 registers a thread, and spills (up to 168 bytes) in the
    // quantized and head-dim-256 tiles.
    for (int row_step = 0; attention_tile_rows<Cfg, Work>(p, row_step); ++row_step)
      __syncthreads();  // the row tile's shared memory (rows, stages, epilogue rows) is free
  } else {
    attention_tile_rows<Cfg, Work>(p, 0);
  }
}

}  // namespace tileinfer
