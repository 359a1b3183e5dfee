// fp32 attention on CUDA cores: products and sums in fp32 (no tf32 tensor
// cores), so that it meets 1e-5 relative against exact attention (the fp32
// accuracy contract). Same work mapping (attention_work.cuh), page lookup and online softmax
// (softmax.cuh, with its soft-cap and sinks) as the tensor-core kernel; speed is secondary.
//
// A block of 128 threads holds 16 query rows; 8 consecutive lanes share a row.
// Per tile of 32 key positions: K and V go through shared memory; lane j of a
// row scores keys j, j+8, j+16, j+24 (full dot products over D), the online
// softmax reduces over the row's 8 lanes, the probabilities go through shared
// memory, and lane j accumulates output chunks j, j+8, ... (4 floats each).
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "attention_work.cuh"
#include "common.cuh"
#include "params.h"
#include "softmax.cuh"

namespace tileinfer {

template <int kHeadDim>
struct Fp32Config {
  static constexpr int D = kHeadDim;
  static constexpr int kThreads = 128;
  static constexpr int kBlockM = 16;
  static constexpr int kBlockN = 32;
  static constexpr int kLanesPerRow = kThreads / kBlockM;              // 8
  static constexpr int kKeysPerLane = kBlockN / kLanesPerRow;          // 4
  static constexpr int kChunksPerLane = D / 4 / kLanesPerRow;          // float4 output chunks per lane
  // Q and K rows padded by 4 floats: the 8 lanes of a row read 8 different keys
  // at the same column, which then fall into 8 different bank groups.
  static constexpr int kStride = D + 4;
  // Probabilities: rows padded by one float, so the 4 rows of a warp that read
  // one probability each (broadcast over the row's lanes) hit 4 different banks.
  static constexpr int kPStride = kBlockN + 1;
  static constexpr int kSmemFloats = kBlockM * kStride + kBlockN * kStride + kBlockN * D + kBlockM * kPStride;
  static constexpr int kSmemBytes = kSmemFloats * 4 + (kBlockN + 3 * kBlockM) * 4;
};

template <int kHeadDim, class Work>
__global__ void __launch_bounds__(128) attention_fp32_kernel(const __grid_constant__ AttentionParams p) {
  using Cfg = Fp32Config<kHeadDim>;
  constexpr int D = Cfg::D;
  constexpr int BM = Cfg::kBlockM;
  constexpr int BN = Cfg::kBlockN;
  constexpr int kStride = Cfg::kStride;

  extern __shared__ __align__(16) float smem_f[];
  float* q_s = smem_f;                  // [BM][kStride]
  float* k_s = q_s + BM * kStride;      // [BN][kStride]
  float* v_s = k_s + BN * kStride;      // [BN][D]
  float* p_s = v_s + BN * D;            // [BM][kPStride] probabilities of the tile
  int* key_rows_s = reinterpret_cast<int*>(p_s + BM * Cfg::kPStride);  // [BN]
  int* row_token_s = key_rows_s + BN;   // [BM]
  int* row_head_s = row_token_s + BM;   // [BM]
  int* row_qpos_s = row_head_s + BM;    // [BM]

  wait_for_prior_grids();  // programmatic launches (common.cuh)
  const WorkItem w = Work::template make<BM>(p);
  Work::template mark_padding_rows<float>(p);
  if (!w.active) return;

  const int tid = threadIdx.x;
  const int row = tid / Cfg::kLanesPerRow;  // this thread's query row
  const int j = tid % Cfg::kLanesPerRow;    // its lane within the row
  const int page_shift = __ffs(p.kv.page_size) - 1;
  const float* k_pool = static_cast<const float*>(p.kv.k_cache);
  const float* v_pool = static_cast<const float*>(p.kv.v_cache);
  const float* q_ptr = static_cast<const float*>(p.q);
  const int num_tiles = w.key_end > w.key_begin ? ceil_div(w.key_end - w.key_begin, BN) : 0;
  // Head dims below the tile's (tile_table.h): zeros past the row in shared
  // memory, nothing stored past it.
  const int hd = p.kv.head_dim;

  write_row_table<BM, Cfg::kThreads>(w, tid, row_token_s, row_head_s, row_qpos_s);
  __syncthreads();
  for (int c = tid; c < BM * (D / 4); c += Cfg::kThreads) {
    const int r = c / (D / 4);
    const int ch = c % (D / 4);
    const int token = row_token_s[r];
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (token >= 0 && ch * 4 < hd)
      x = *reinterpret_cast<const float4*>(q_ptr + token * p.q_stride_token + row_head_s[r] * p.q_stride_head + ch * 4);
    *reinterpret_cast<float4*>(q_s + r * kStride + ch * 4) = x;
  }
  const int qpos = row_qpos_s[row];

  OnlineSoftmax<1, Cfg::kLanesPerRow> sm;
  sm.row[0].init(Work::sink(p, w, row_head_s[row]), j == 0);  // a sink starts the row (softmax.cuh)
  float4 acc[Cfg::kChunksPerLane];  // output columns 4 (j + 8i) .. 4 (j + 8i) + 3
#pragma unroll
  for (int i = 0; i < Cfg::kChunksPerLane; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  // Scores in log2 units (scale * log2(e), or a soft-cap, applied per score
  // with the library's tanh: softmax.cuh), and this row's window.
  const ScoreMap smap = ScoreMap::make(p.scale, p.soft_cap);
  const int lo = window_first_key(qpos, p.window_left);
  // Tree verify: this row's word, and the first key it can hide (INT_MAX: no tree).
  const int tree_from = Work::kTree ? tree_first_key(p, w) : INT_MAX;
  const uint32_t tree = Work::kTree ? tree_word(p, row_token_s[row]) : ~0u;

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int tile_pos = w.key_begin + tile * BN;
    __syncthreads();  // the previous tile's K, V and key rows are no longer read
    if (tid < BN) key_rows_s[tid] = pool_row(p.kv, w.seq, w.kv_head, tile_pos + tid, w.key_end, page_shift);
    __syncthreads();
    for (int c = tid; c < BN * (D / 4); c += Cfg::kThreads) {
      const int key = c / (D / 4);
      const int ch = c % (D / 4);
      const int pr = key_rows_s[key];
      float4 kx = make_float4(0.f, 0.f, 0.f, 0.f);
      float4 vx = kx;
      if (pr >= 0 && ch * 4 < hd) {
        kx = *reinterpret_cast<const float4*>(k_pool + static_cast<int64_t>(pr) * hd + ch * 4);
        vx = *reinterpret_cast<const float4*>(v_pool + static_cast<int64_t>(pr) * hd + ch * 4);
      }
      *reinterpret_cast<float4*>(k_s + key * kStride + ch * 4) = kx;
      *reinterpret_cast<float4*>(v_s + key * D + ch * 4) = vx;
    }
    __syncthreads();

    float s[1][Cfg::kKeysPerLane];
#pragma unroll
    for (int i = 0; i < Cfg::kKeysPerLane; ++i) s[0][i] = 0.f;
#pragma unroll 8
    for (int d = 0; d < D; d += 4) {
      const float4 qv = *reinterpret_cast<const float4*>(q_s + row * kStride + d);
#pragma unroll
      for (int i = 0; i < Cfg::kKeysPerLane; ++i) {
        const float4 kv = *reinterpret_cast<const float4*>(k_s + (j + 8 * i) * kStride + d);
        s[0][i] = fmaf(qv.x, kv.x, s[0][i]);
        s[0][i] = fmaf(qv.y, kv.y, s[0][i]);
        s[0][i] = fmaf(qv.z, kv.z, s[0][i]);
        s[0][i] = fmaf(qv.w, kv.w, s[0][i]);
      }
    }
#pragma unroll
    for (int i = 0; i < Cfg::kKeysPerLane; ++i) {
      const int key = j + 8 * i;
      const bool visible = key_rows_s[key] >= 0 && !(p.causal && tile_pos + key > qpos) && tile_pos + key >= lo &&
                           !tree_hides(tree, tile_pos + key, tree_from);
      s[0][i] = visible ? smap.log2_score_precise(s[0][i]) : kNegInf;
    }
    float factor[1];
    sm.update(s, 1.f, factor);  // scores scaled above
#pragma unroll
    for (int i = 0; i < Cfg::kKeysPerLane; ++i) p_s[row * Cfg::kPStride + j + 8 * i] = s[0][i];
    __syncwarp();  // a row's 8 lanes are in one warp
#pragma unroll
    for (int i = 0; i < Cfg::kChunksPerLane; ++i) {
      acc[i].x *= factor[0];
      acc[i].y *= factor[0];
      acc[i].z *= factor[0];
      acc[i].w *= factor[0];
    }
#pragma unroll 4
    for (int key = 0; key < BN; ++key) {
      const float pk = p_s[row * Cfg::kPStride + key];
#pragma unroll
      for (int i = 0; i < Cfg::kChunksPerLane; ++i) {
        const float4 vv = *reinterpret_cast<const float4*>(v_s + key * D + 4 * (j + 8 * i));
        acc[i].x = fmaf(pk, vv.x, acc[i].x);
        acc[i].y = fmaf(pk, vv.y, acc[i].y);
        acc[i].z = fmaf(pk, vv.z, acc[i].z);
        acc[i].w = fmaf(pk, vv.w, acc[i].w);
      }
    }
  }

  allow_dependent_launch();  // at the epilogue, as attention_tile_kernel
  sm.reduce_sums();
  const SoftmaxResult res = softmax_result(sm.row[0].m, sm.row[0].l);
  const int token = row_token_s[row];
  if (token < 0) return;
  float* out = output_row<float>(p, token, row_head_s[row]);  // partials or `out`: both fp32 here
  if constexpr (Work::kPartials) {
    if (Work::writes_partials(p)) out = Work::partial_row(p, w, token, row_head_s[row]);
  }
#pragma unroll
  for (int i = 0; i < Cfg::kChunksPerLane; ++i) {
    const float4 x = make_float4(acc[i].x * res.inv_sum, acc[i].y * res.inv_sum, acc[i].z * res.inv_sum,
                                 acc[i].w * res.inv_sum);
    if (4 * (j + 8 * i) < hd) *reinterpret_cast<float4*>(out + 4 * (j + 8 * i)) = x;
  }
  if (j == 0) {
    float* lse = Work::lse_at(p, w, token, row_head_s[row]);
    if (lse != nullptr) *lse = res.lse;
  }
}

}  // namespace tileinfer
