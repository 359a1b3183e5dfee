// Decode splits merged inside a thread-block cluster, for the steps whose
// default plan gives each (sequence, KV head) 2 splits (decode_splits.h:
// 89-132 pairs on 132 SMs, e.g. 32 sequences of 4 KV heads, or 16 of 8).
// Each split's block would write an fp32 partial that a second launch,
// combine, reads back and merges (PERFORMANCE.md, "Decode, groups that are
// not powers of two"). Launched as clusters of two blocks along the grid's
// split axis (attention_host.h), the blocks of one (sequence, KV head, row
// tile) stage their normalized rows and lses in shared memory as for a
// partial, wait for one another (a cluster barrier), and each merges a share
// of the rows from both blocks' shared memory (distributed shared memory)
// into `out`. A second barrier keeps every block resident until the other
// has read it. No partials, no combine launch.
//
// The merge is combine's, operation for operation (combine.cuh, the
// one-chunk path that every count up to a row's lanes takes): the same
// lanes per row, a split's lse in lane s, the same shuffle trees for the
// maximum and the weights' sum, the FMAs in split order over the same fp32
// values (a partial row is staged_row_sum's sum of the key-slice warps'
// parts, as store_output_rows writes it), and the same normalization and
// stores, and combine's FMAs past the last split (zero weight times zero),
// which turn a -0 into +0. So a row's bits are those of decode + combine with
// the same split count (tests/test_attention_gpu.py compares them).
#pragma once

#include <cooperative_groups.h>

#include "attention_work.cuh"
#include "combine.cuh"
#include "tile_io.cuh"
#include "tile_smem.cuh"

namespace tileinfer {

// The cluster of decode splits (csrc/ops/decode.cu): 2. Two blocks of a
// kernel that runs two an SM fit any SM, so a grid of one wave stays one
// wave; clusters of 4 (53-66 pairs) were much slower than partials +
// combine (PERFORMANCE.md, "What did not pay").
constexpr int kMaxClusterSplits = 2;

// The last barrier only keeps each block resident until the others have read
// it (their loads are done: their values went into the stores before it), so
// its arrive orders nothing: a release there would wait for the `out` stores.
__device__ __forceinline__ void cluster_arrive_relaxed_and_wait() {
  asm volatile(
      "barrier.cluster.arrive.relaxed.aligned;\n"
      "barrier.cluster.wait.aligned;\n" ::: "memory");
}

// Every block of the cluster calls this after staging its rows (sh.o, sh.lse)
// behind a block barrier, and returns when the cluster's rows are written.
template <class Cfg>
__device__ __forceinline__ void cluster_merge_rows(const AttentionParams& p, const TileSmem<Cfg>& sh, int tid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  using QT = typename Cfg::QT;
  using Traits = CombineTraits<Cfg::D>;
  constexpr int R = Traits::kLanesPerRow;
  constexpr int C = Traits::kChannelsPerLane;
  constexpr int BM = Cfg::kBlockM;
  constexpr int kGroups = Cfg::kThreads / R;  // rows a block merges at a time
  static_assert(32 % R == 0 && Cfg::kThreads % 32 == 0, "a row's lanes must sit in one warp");
  cg::cluster_group cluster = cg::this_cluster();
  const int S = p.cluster_splits;  // the cluster's blocks, split s in block rank s
  const int rank = static_cast<int>(cluster.block_rank());
  const int lane = tid % R;
  const int group = tid / R;
  const bool lane_on = lane * C < p.kv.head_dim;
  const float* o_of[kMaxClusterSplits];
#pragma unroll
  for (int s = 0; s < kMaxClusterSplits; ++s) o_of[s] = cluster.map_shared_rank(sh.o, s < S ? s : 0);
  const float* lse_of_lane = cluster.map_shared_rank(sh.lse, lane < S ? lane : 0);
  cluster.sync();  // every block's rows and lses staged

  // Row group g of the block of rank r takes rows g S + r, + S kGroups, ...:
  // the rows of a small group (4 of a 16-row tile) spread over the blocks.
  // Every lane runs every pass (the shuffles take the whole warp); rows past
  // the tile read row BM - 1 and rows of no query store nothing.
  for (int base = 0; base < BM; base += S * kGroups) {
    const int r = base + group * S + rank;
    const int row = r < BM ? r : BM - 1;
    const int token = r < BM ? sh.row_token[row] : -1;
    // combine's one-chunk merge, from here to the stores (rows of no query
    // load nothing: their lanes still take part in the shuffles).
    const float l = lane < S && token >= 0 ? lse_of_lane[row] : -INFINITY;
    float v[kMaxClusterSplits][C];
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
#pragma unroll
      for (int k = 0; k < C / 4; ++k) {
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (s < S && lane_on && token >= 0) {
          x = staged_row_sum<BM, Cfg::kWarpsN, Cfg::kOStride>(o_of[s], row, lane * C + 4 * k);
        }
        v[s][4 * k] = x.x;
        v[s][4 * k + 1] = x.y;
        v[s][4 * k + 2] = x.z;
        v[s][4 * k + 3] = x.w;
      }
    }
    const float run_max = fmaxf(-INFINITY, warp_max<R>(l));
    const float base_lse = run_max == -INFINITY ? 0.f : run_max;
    const float w = exp2f((l - base_lse) * kLog2e);  // 0 past the cluster's splits
    const float den = warp_sum<R>(w);
    float acc[C];
#pragma unroll
    for (int i = 0; i < C; ++i) acc[i] = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      const float ws = __shfl_sync(0xffffffffu, w, s, R);
      if (s < S) {
#pragma unroll
        for (int i = 0; i < C; ++i) acc[i] = fmaf(ws, v[s][i], acc[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < C; ++i) acc[i] = __fadd_rn(acc[i], 0.f);  // combine's fmaf(0, 0, acc) past the splits
    if (token >= 0) {
      const float inv = den > 0.f ? 1.f / den : 0.f;
#pragma unroll
      for (int i = 0; i < C; ++i) acc[i] = den > 0.f ? acc[i] * inv : 0.f;
      const int head = sh.row_head[row];
      if (lane_on) store_channels<QT, C>(output_row<QT>(p, token, head) + lane * C, acc);
      float* lse = output_lse(p, token, head);
      if (lse != nullptr && lane == 0) *lse = den > 0.f ? run_max + logf(den) : -INFINITY;
    }
  }
  cluster_arrive_relaxed_and_wait();  // no block leaves while another reads its shared memory
#endif
}

}  // namespace tileinfer
