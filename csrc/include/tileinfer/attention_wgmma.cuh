// Synchronous Hopper (sm_90a) prefill kernel on warpgroup MMA (wgmma): bf16 /
// fp16, a cache of the queries' type. csrc/ops/prefill.cu picks it on a 9.0
// device of an sm_90a build for the groups that the warp-specialized kernel
// (sm90/prefill_kernel.cuh) cannot copy as one box (groups that are not powers
// of two). Same work mapping (PrefillWork), key walk, masking and numerics as
// attention_tile_kernel (attention_kernel.cuh); only the matrix products and
// the shared-memory layouts differ.
//
// Structure (FlashAttention-2's loop, FlashAttention-3's operand placement):
//   - a block of kWarpGroups warpgroups (128 threads each) holds 64 query rows
//     per warpgroup; rows are (query, head) pairs of one KV head's group
//     (PrefillWork::make);
//   - every thread takes part in the copies: per-key pool rows are looked up
//     through the block table (one int per key, kStages tiles ahead, as in the
//     tile kernel), K / V tiles of kBlockN keys are gathered with 16-byte
//     cp.async, kStages deep, zero-filled for skipped keys; Q once;
//   - S = Q K^T: wgmma m64n{kBlockN}k16, A = Q and B = K both from shared memory
//     (K-major), 8 instructions over the head dim, fp32 accumulators;
//   - online softmax (softmax.cuh, OnlineSoftmax<2, 4>, with its soft-cap and
//     sinks: the accumulator of m64nNk16 gives each thread rows g and g + 8 of
//     its warp's 16, each row over the 4 lanes of a quad, exactly the
//     mma.m16n8k16 C layout repeated over N / 8), masks only on tiles with
//     skipped keys, on the diagonal or on a window's edge; tiles before the
//     warpgroup's window skipped as those after its last query;
//   - O += P V: P rounded to T stays in registers and is the A operand (the S
//     accumulator of 16 keys is, register for register, the A fragment of
//     m64nNk16, as with mma.sync), B = V from shared memory, N-major
//     (imm-trans-b = 1), wgmma m64n128k16;
//   - epilogue as in the tile kernel (fp32 rows staged in shared memory,
//     normalized, 16-byte stores of T; lse; rows of no query untouched).
//
// Shared-memory layout of every operand tile (Q, K, V): the 128-byte-swizzle
// layout of the wgmma descriptors. A tile of R rows x D elements is D / 64
// blocks, one per 64 columns of the head dim; a block is R rows of 128
// bytes, and 16-byte chunk c of row r sits at chunk position c ^ (r % 8). Each
// 8-row group is one 1024-byte swizzle atom (the hardware XORs address bits
// [7, 10) into bits [4, 7), so every block starts 1024-byte aligned).
//   - Q and K, K-major operands (rows = M or N, 16 k-elements = 32 bytes of a
//     row): start = block of k-step kk / 4, + 32 (kk % 4) bytes inside the
//     atom; SBO = 1024 (next 8 rows); LBO unused for swizzled K-major (1).
//   - V, the N-major B operand of P V (rows = keys = k, 128 bytes of 64 d =
//     n): start = 16 kk rows into block 0; LBO = offset of the next 64 n
//     (block 1: R * 128 bytes); SBO = 1024 (next 8 keys).
// K and V tiles therefore have the same layout, and cp.async writes whole
// 128-byte half rows either way.
//
// Ordering: cp.async writes shared memory through the generic proxy, wgmma
// reads it through the async proxy: after cp.async.wait_group every thread
// issues fence.proxy.async.shared::cta, then the block barrier. wgmma.fence
// before the first wgmma of a batch (its accumulator / A registers were
// written by ordinary instructions), commit_group + wait_group 0 after, and
// the accumulator registers go through an empty asm after the wait so the
// compiler does not move their uses above it.
//
// The warp-specialized kernel does what this loop does not: a producer warp
// with bulk copies, ping-pong between the warpgroups and the softmax of one
// tile under the products of the previous one.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "attention_work.cuh"
#include "common.cuh"
#include "tile_io.cuh"
#include "mma.cuh"
#include "params.h"
#include "softmax.cuh"
#include "sm90/wgmma.cuh"

namespace tileinfer {

// Tile shape of the wgmma prefill kernel: kWarpGroups x 64 query rows,
// kBlockN keys per tile (64 or 128: the N of the S product), kStages K / V
// stages. Head dim 64, 128 or 256 (the P V product is one m64n{D}k16 per 16
// keys; d 256 holds a 128-register O accumulator per thread, so 64-key tiles).
template <typename T_, int D_, int kWarpGroups_, int kBlockN_, int kStages_>
struct WgmmaPrefillConfig {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int kWarpGroups = kWarpGroups_;
  static constexpr int kThreads = 128 * kWarpGroups;
  static constexpr int kBlockM = 64 * kWarpGroups;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kRowSlots = kStages + 1;  // key-row lookups run one tile ahead of the copies
  static constexpr int kRowBytes = D * 2;        // one Q / K / V row
  static constexpr int kChunks = kRowBytes / 16;  // 16-byte chunks per row (D / 64 128-byte blocks)
  static constexpr int kFlags = KeyTiles<kBlockN, kStages, kRowSlots>::kFlags;

  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "bf16 / fp16");
  static_assert(D == 64 || D == 128 || D == 256, "head dim 64, 128 or 256");
  static_assert(kBlockN == 64 || kBlockN == 128, "S = Q K^T is one m64n{64,128} accumulator");
  static_assert(kBlockN <= kThreads, "one lookup thread per key");
  static_assert((kBlockN * kChunks) % kThreads == 0 && (kBlockM * kChunks) % kThreads == 0, "whole copy rounds");
  static_assert(kStages >= 2, "at least double buffering");

  // Shared memory, in bytes; the operand tiles first (each 1024-byte aligned).
  static constexpr int kTileBytes = kBlockN * kRowBytes;  // one staged K or V tile
  static constexpr int kKVBytes = kStages * 2 * kTileBytes;
  static constexpr int kOStride = D + 8;                  // fp32 epilogue rows (+8 floats: fewer bank conflicts)
  static constexpr int kOBytes = kBlockM * kOStride * 4;  // reuses the K / V stages once they are dead
  static constexpr int kMainBytes = ((kKVBytes > kOBytes ? kKVBytes : kOBytes) + 1023) / 1024 * 1024;
  static constexpr int kQBytes = kBlockM * kRowBytes;
  static constexpr int kIntBytes = (kRowSlots * kBlockN          // key rows
                                    + kRowSlots * kFlags         // "tile has skipped keys" flags
                                    + 3 * kBlockM                // row token / head / position
                                    + kStages * kBlockN) * 4;    // block-table entries
  static constexpr int kFloatBytes = kBlockM * 4;  // lse
  static constexpr int kAlign = 1024;              // slack to align the dynamic buffer to a swizzle atom
  static constexpr int kSmemBytes = kAlign + kMainBytes + kQBytes + kIntBytes + kFloatBytes;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");

  // Byte offset of 16-byte chunk `ch` (0..15) of row `row` in a tile of `rows`
  // rows: block ch / 8 (64 columns), row * 128, chunk (ch % 8) ^ (row % 8).
  __device__ static __forceinline__ int offset(int rows, int row, int ch) {
    return (ch >> 3) * rows * 128 + row * 128 + (((ch & 7) ^ (row & 7)) << 4);
  }
};

template <class Cfg, class Work>
__global__ void __launch_bounds__(Cfg::kThreads, 1) attention_wgmma_kernel(const __grid_constant__ AttentionParams p) {
#if TILEINFER_WGMMA_ENABLED
  using T = typename Cfg::T;
  constexpr int D = Cfg::D;
  constexpr int BM = Cfg::kBlockM;
  constexpr int BN = Cfg::kBlockN;
  constexpr int S = Cfg::kStages;
  constexpr int kSlots = Cfg::kRowSlots;
  constexpr int kFlags = Cfg::kFlags;

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // The swizzle is a function of the address bits: align the operand tiles to
  // 1024 bytes whatever the dynamic buffer's base (kAlign bytes of slack).
  uint8_t* smem = smem_raw + ((Cfg::kAlign - (smem_addr(smem_raw) & (Cfg::kAlign - 1))) & (Cfg::kAlign - 1));
  uint8_t* kv_s = smem;                                  // [S][K, V][D / 64 blocks][BN rows][128 B]
  float* o_s = reinterpret_cast<float*>(smem);           // epilogue: [BM][kOStride]
  uint8_t* q_s = smem + Cfg::kMainBytes;                 // [D / 64 blocks][BM rows][128 B]
  int* key_rows_s = reinterpret_cast<int*>(q_s + Cfg::kQBytes);  // [kSlots][BN]
  int* flags_s = key_rows_s + kSlots * BN;                       // [kSlots][kFlags]
  int* row_token_s = flags_s + kSlots * kFlags;  // [BM] token of each row, -1: padding
  int* row_head_s = row_token_s + BM;            // [BM] query head of each row
  int* row_qpos_s = row_head_s + BM;             // [BM] position of each row's query
  int* entries_s = row_qpos_s + BM;              // [S][BN] block-table entry of each key's page
  float* lse_s = reinterpret_cast<float*>(entries_s + S * BN);  // [BM]

  wait_for_prior_grids();  // programmatic launches (common.cuh)
  const WorkItem w = Work::template make<BM>(p);
  Work::template mark_padding_rows<T>(p);
  if (!w.active) return;  // block-uniform

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wg = warp >> 2;  // warpgroup: rows [64 wg, 64 wg + 64) of the block
  const int page_shift = __ffs(p.kv.page_size) - 1;  // page sizes are powers of two (checked on the host)
  const uint8_t* k_pool = static_cast<const uint8_t*>(p.kv.k_cache);
  const uint8_t* v_pool = static_cast<const uint8_t*>(p.kv.v_cache);
  const int num_tiles = w.key_end > w.key_begin ? ceil_div(w.key_end - w.key_begin, BN) : 0;

  write_row_table<BM, Cfg::kThreads>(w, tid, row_token_s, row_head_s, row_qpos_s);

  // Key lookups and copies: as in attention_tile_kernel (tile_io.cuh).
  const KeyTiles<BN, S, kSlots> keys{p.kv, w, tid, page_shift, key_rows_s, flags_s, entries_s, p.kv.head_dim * 2};
  auto load_tile = [&](int tile) {
    uint8_t* k_dst = kv_s + (tile % S) * 2 * Cfg::kTileBytes;
    keys.template copy_kv<Cfg::kThreads, Cfg::kChunks, Cfg::kRowBytes, false>(
        tile, k_pool, v_pool, k_dst, k_dst + Cfg::kTileBytes, [](int row, int ch) { return Cfg::offset(BN, row, ch); });
  };

  keys.lookup_first(num_tiles);
  __syncthreads();  // row table and the first lookups

  copy_query_rows<BM, Cfg::kThreads, Cfg::kChunks, T>(p, row_token_s, row_head_s, q_s, tid,
                                                      [](int row, int ch) { return Cfg::offset(BM, row, ch); });
  cp_async_commit();
#pragma unroll
  for (int j = 0; j < S - 1; ++j) {
    if (j < num_tiles) load_tile(j);
    cp_async_commit();  // empty groups keep the group count uniform
  }

  // This thread's rows: g and g + 8 of its warp's 16 (g = lane / 4); local row
  // R is row 64 wg + 16 (warp % 4) + g + 8 R of the block.
  auto row_of = [&](int R) { return 16 * warp + (lane >> 2) + 8 * R; };
  int qpos[2];
#pragma unroll
  for (int R = 0; R < 2; ++R) qpos[R] = row_qpos_s[row_of(R)];
  // The warpgroup's query positions (wgmma is issued by the whole warpgroup,
  // so its skips are warpgroup-uniform). Rows are (query, head) pairs ordered
  // by query: positions grow with the row, padding rows come last.
  const int wg_rows = min(w.q_count * w.group - w.row_base - 64 * wg, 64);  // valid rows of the warpgroup
  const bool wg_has_rows = wg_rows > 0;
  const int wg_qmin = wg_has_rows ? row_qpos_s[64 * wg] : INT_MAX;
  const int wg_qmax = wg_has_rows ? row_qpos_s[64 * wg + wg_rows - 1] : INT_MIN;

  OnlineSoftmax<2, 4> sm;
#pragma unroll
  for (int R = 0; R < 2; ++R) sm.row[R].init();  // a sink joins in the epilogue
  float o[D / 2];  // O: o[4 j + 2 R + e] is row R, column 8 j + 2 (lane % 4) + e
#pragma unroll
  for (int x = 0; x < D / 2; ++x) o[x] = 0.f;
  const ScoreMap smap = ScoreMap::make(p.scale, p.soft_cap);  // see attention_tile_kernel
  // Window: the warpgroup's first row sees keys from wg_lo on (0 without a window).
  const int wg_lo = window_first_key(wg_qmin, p.window_left);
  const int quad = lane & 3;
  const uint32_t q_base = smem_addr(q_s) + 64 * wg * 128;  // this warpgroup's 64 rows of block 0
  const uint32_t kv_base = smem_addr(kv_s);

  for (int i = 0; i < num_tiles; ++i) {
    cp_async_wait<S - 2>();              // tile i (and Q) landed: this thread's copies ...
    wgmma::fence_proxy_async_smem();     // ... visible to the tensor cores' (async proxy) reads ...
    __syncthreads();                     // ... everyone's; and everyone is done with tile i - 1
    if (i + S - 1 < num_tiles) load_tile(i + S - 1);  // into the stage tile i - 1 used
    cp_async_commit();
    if (i + S < num_tiles) keys.lookup(i + S);  // into the slot tile i - 1 used

    const int tile_pos = w.key_begin + i * BN;  // position of the tile's key 0
    if (!wg_has_rows || (p.causal && tile_pos > wg_qmax) || tile_pos + BN <= wg_lo) {
      continue;  // warpgroup-uniform: nothing visible (after the last query, or before the window)
    }

    const uint32_t k_tile = kv_base + (i % S) * 2 * Cfg::kTileBytes;
    const uint32_t v_tile = k_tile + Cfg::kTileBytes;

    // S = Q K^T over the head dim, 16 at a time (k-step kk: block kk / 4, 32 (kk % 4) bytes in).
    float acc[BN / 2];
    wgmma::issue_qk<T, BM, BN, D>(acc, q_base, k_tile);
    wgmma::wait<0>();
    wgmma::fence_regs(acc);
    float s[2][BN / 4];
    wgmma::acc_to_rows<BN>(acc, s);
    smap.apply(s);

    // Masks: only on tiles with skipped keys, overlapping the causal diagonal,
    // or reaching before some row's window.
    const int slot = i % kSlots;
    bool skipped = false;
#pragma unroll
    for (int f = 0; f < kFlags; ++f) skipped |= flags_s[slot * kFlags + f] != 0;
    if (skipped || (p.causal && tile_pos + BN - 1 > wg_qmin) ||
        tile_pos < window_first_key(qpos[1], p.window_left)) {  // the window's edge: per thread, its later row
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = 8 * j + 2 * quad + e;
          const bool present = key_rows_s[slot * BN + key] >= 0;
          const int kpos = tile_pos + key;
#pragma unroll
          for (int R = 0; R < 2; ++R)
            if (!present || (p.causal && kpos > qpos[R]) || kpos < window_first_key(qpos[R], p.window_left))
              s[R][2 * j + e] = kNegInf;
        }
    }

    float factor[2];
    sm.update(s, smap.k, factor);  // s now holds the probabilities
    wgmma::rescale_rows<D>(o, factor);

    // O += P V: P rounded to T is the A operand from registers, V the N-major B operand.
    uint32_t a[BN / 16][4];
    wgmma::rows_to_a<T, BN>(s, a);
    wgmma::issue_pv<T, D, BN>(o, a, v_tile);
    wgmma::wait_pv<D, BN>(o, a);
  }

  // ---- Epilogue (attention_tile_kernel's, one key slice) ----
  allow_dependent_launch();  // here, as attention_tile_kernel
  cp_async_wait<0>();
  __syncthreads();  // K/V stages are free: o_s may overwrite them
  sm.reduce_sums();
  float out_scale[2];
#pragma unroll
  for (int R = 0; R < 2; ++R) {
    const SoftmaxResult res = softmax_result_with_sink(sm.row[R], Work::sink(p, w, row_head_s[row_of(R)]));
    out_scale[R] = res.inv_sum;
    if (quad == 0) lse_s[row_of(R)] = res.lse;
  }
#pragma unroll
  for (int R = 0; R < 2; ++R) {
    float* dst = o_s + row_of(R) * Cfg::kOStride + 2 * quad;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<float2*>(dst + 8 * j) =
          make_float2(o[4 * j + 2 * R] * out_scale[R], o[4 * j + 2 * R + 1] * out_scale[R]);
  }
  __syncthreads();

  store_output_rows<BM, D, Cfg::kThreads, 1, Cfg::kOStride>(
      o_s, row_token_s, row_head_s, tid, p.kv.head_dim, [&](int token, int head) { return output_row<T>(p, token, head); });
  if (tid < BM && row_token_s[tid] >= 0) {
    float* lse = Work::lse_at(p, w, row_token_s[tid], row_head_s[tid]);
    if (lse != nullptr) *lse = lse_s[tid];
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built without sm_90a: the launcher only picks this kernel on a 9.x device of an sm_90a build
#endif
}

}  // namespace tileinfer
