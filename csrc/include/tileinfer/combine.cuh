// Combine: merges partial attention results of one query row (decode splits,
// or prefill outputs with lse over disjoint page ranges) into the final output.
//
// Partial format (params.h, docs/DESIGN.md "Partial results"): out_i normalized
// by its own softmax sum, lse_i the natural-log log-sum-exp of its scores; a
// neutral partial is out_i = 0, lse_i = -inf. The merge is
//   M = max_i lse_i,  w_i = exp(lse_i - M),  out = sum_i w_i out_i / sum_i w_i,
//   lse = M + log(sum_i w_i),
// and a row whose partials are all neutral gives out = 0, lse = -inf. (A
// batch-invariant plan's partials take the same merge as a running one, split
// by split: kLseGated below.)
//
// Memory-bound: a row reads num_splits * head_dim fp32 values and writes
// head_dim. A group of lanes owns one (token, head) row; each lane owns a few
// consecutive channels and reads them with 16-byte loads, a batch of splits
// in flight at once. The lanes of a row read the lses once, a chunk of
// kLanesPerRow splits at a time (one lse per lane), and hand each split's
// weight to the whole group with a shuffle. Neutral splits are read like the
// others (a branch per split would serialize the loads); their out = 0 adds
// nothing, and a NaN there would propagate, as in reference.merge_partials.
// (The gated kernel neither reads nor merges them.)
// More splits than a row's lanes are shared by several warps (kWideWarps),
// whose merges meet in shared memory.
//
// Determinism: every output element sums its splits in a fixed order (index
// order, or with several warps each warp's chunks in index order and the
// warps in theirs) and the lse reductions use a fixed shuffle tree, so the
// same inputs give the same bits on every run, whatever the grid.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention_work.cuh"
#include "common.cuh"
#include "params.h"
#include "split_merge.cuh"

namespace tileinfer {

template <int HEAD_DIM>
struct CombineTraits {
  // One float4 per lane per split, or two for head_dim 256 so a row still fits
  // in a warp: every load is 16 bytes and a row's lanes read whole 512-byte
  // (or 1-KB) rows of a partial, fully coalesced.
  static constexpr int kChannelsPerLane = HEAD_DIM <= 128 ? 4 : 8;
  static constexpr int kLanesPerRow = HEAD_DIM / kChannelsPerLane;  // 16, 32, 32
  static constexpr int kVecsPerLane = kChannelsPerLane / 4;         // float4s per lane per split
  // Splits loaded before the first multiply-add: 16 independent 16-byte loads
  // in flight per lane, 32 at head dim 128. A decode step of one sequence has
  // few rows, so its combine is latency-bound: the lse read plus one round trip
  // per batch (32 splits: 2 batches, not 4 with 8 loads; at head dim 128 one,
  // with the lse loads).
  static constexpr int kSplitBatch = HEAD_DIM == 128 ? 32 : 16 / kVecsPerLane;
  // Small blocks: a decode step of one sequence has only num_q_heads rows, so
  // 2-4 rows per block spreads even that over many SMs.
  static constexpr int kThreads = 64;
  static constexpr int kRowsPerBlock = kThreads / kLanesPerRow;
  // A register cap (8 resident blocks per SM: 128) keeps the whole batch of
  // loads in flight: without one, ptxas lowers registers by issuing each load
  // just before its use, leaving only 2-3 loads of a batch in flight (seen in
  // the SASS). It uses ~96; 20 warps per SM still keep >100 KB of loads in flight.
  // Head dim 128's batch of 32 splits takes ~160 registers: 4 blocks.
  static constexpr int kMinBlocksPerSM = kSplitBatch * kVecsPerLane > 16 ? 4 : 8;
  // More splits than a row's lanes (a step of fewer than 8 (sequence, KV
  // head) pairs gets up to 128: decode_splits.h) are shared by kWideWarps
  // warps, each taking every kWideWarps-th chunk of kLanesPerRow splits,
  // whose partial merges meet in shared memory: one sequence's 128 splits
  // at head dim 128 take one round trip of loads instead of four in turn.
  static constexpr int kWideWarps = 4;
  static constexpr int kWarpRows = 32 / kLanesPerRow;  // rows per warp
  static_assert(kLanesPerRow <= 32 && 32 % kLanesPerRow == 0, "a row's lanes must sit in one warp");
  static_assert(kLanesPerRow % kSplitBatch == 0, "split batches must tile a chunk");
};

// Stores `C` channels converted to scalar_t with vector stores (16 bytes; 8 for
// four 16-bit channels), or element by element when a strided view of `out`
// leaves the address unaligned. __stwb (a plain write-back store) because
// nvcc splits a struct assignment through a cast pointer into 4-byte stores.
template <typename scalar_t, int C>
__device__ __forceinline__ void store_channels(scalar_t* dst, const float (&x)[C]) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(dst);
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (addr % 16 == 0) {
#pragma unroll
      for (int k = 0; k < C / 4; ++k)
        __stwb(reinterpret_cast<float4*>(dst) + k, make_float4(x[4 * k], x[4 * k + 1], x[4 * k + 2], x[4 * k + 3]));
      return;
    }
  } else if constexpr (C == 4) {
    if (addr % 8 == 0) {
      __stwb(reinterpret_cast<uint2*>(dst), make_uint2(pack2<scalar_t>(x[0], x[1]), pack2<scalar_t>(x[2], x[3])));
      return;
    }
  } else {
    static_assert(C % 8 == 0, "16-bit outputs are stored 8 channels at a time");
    if (addr % 16 == 0) {
#pragma unroll
      for (int k = 0; k < C / 8; ++k)
        __stwb(reinterpret_cast<uint4*>(dst) + k,
               make_uint4(pack2<scalar_t>(x[8 * k], x[8 * k + 1]), pack2<scalar_t>(x[8 * k + 2], x[8 * k + 3]),
                          pack2<scalar_t>(x[8 * k + 4], x[8 * k + 5]), pack2<scalar_t>(x[8 * k + 6], x[8 * k + 7])));
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < C; ++i) dst[i] = from_float<scalar_t>(x[i]);
}

// Grid: ceil(partial_rows * num_q_heads / kRowsPerBlock) blocks of kThreads.
// Uses p.partial_out [num_splits, partial_rows, num_q_heads, kv.head_dim] and
// p.partial_lse [num_splits, partial_rows, num_q_heads] (contiguous; a mixed
// step's rows are slots, attention_work.cuh, mapped back to tokens here), p.out
// [num_tokens, num_q_heads, kv.head_dim] (strides o_stride_token / o_stride_head)
// and p.lse [num_tokens, num_q_heads] (contiguous) or null.
//
// kLseGated (a batch-invariant decode plan, p.split_slots > 0): a partial
// whose lse is -inf may have left its out unwritten (attention_work.cuh,
// DecodeWork::lse_only), so each out is loaded only once its lse is known
// not to be -inf: a round trip more, and no read of the splits a short
// sequence leaves empty. The merge is split_merge.cuh's, split by split, which
// a decode block that walks all of its rows' splits repeats without partials
// (tile_epilogue.cuh): the bits do not depend on which of the two ran. The
// lanes find their splits' factors together (a prefix maximum over the
// chunk), and the accumulator takes them in split order.
//
// W (kWideWarps, for more splits than a row's lanes; never gated): the
// block's W warps share its rows (kWarpRows), warp w taking chunks w, w + W,
// ...; each merges its chunks as the one-warp kernel does, and warp 0 then
// merges the W results in warp order. Deterministic, but not the bits of the
// one-warp order (both ops that merge decode's partials use this kernel).
template <int HEAD_DIM, int W>
struct CombineShape {
  using Traits = CombineTraits<HEAD_DIM>;
  static constexpr int kThreads = W == 1 ? Traits::kThreads : 32 * W;
  static constexpr int kRowsPerBlock = W == 1 ? Traits::kRowsPerBlock : Traits::kWarpRows;
  // The one-warp kernel's register cap per thread.
  static constexpr int kMinBlocksPerSM = Traits::kMinBlocksPerSM * Traits::kThreads / kThreads;
};
template <typename scalar_t, int HEAD_DIM, bool kLseGated, int W>
__global__ void __launch_bounds__(CombineShape<HEAD_DIM, W>::kThreads, CombineShape<HEAD_DIM, W>::kMinBlocksPerSM)
    combine_kernel(const AttentionParams p) {
  using Traits = CombineTraits<HEAD_DIM>;
  using Shape = CombineShape<HEAD_DIM, W>;
  constexpr int R = Traits::kLanesPerRow;
  constexpr int C = Traits::kChannelsPerLane;
  constexpr int V = Traits::kVecsPerLane;
  constexpr int B = Traits::kSplitBatch;
  static_assert(W == 1 || !kLseGated, "gated plans have at most 32 splits: one warp a row");
  allow_dependent_launch();  // (common.cuh)
  wait_for_prior_grids();

  const int lane = threadIdx.x % R;  // lane within the row's group
  const int wr = W == 1 ? 0 : static_cast<int>(threadIdx.x) / 32;  // this warp's share of the chunks
  const int block_row = static_cast<int>(W == 1 ? threadIdx.x : threadIdx.x % 32) / R;
  const int64_t num_rows = static_cast<int64_t>(partial_rows(p)) * p.num_q_heads;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * Shape::kRowsPerBlock + block_row;
  // Rows past the end still run the loop (reading the last row, storing
  // nothing): the shuffles below involve every lane of the warp. So do the
  // slots of a mixed step that hold no decode query.
  bool active = row < num_rows;
  int64_t token = row / p.num_q_heads;  // where the row goes
  if (p.mixed_queries > 0 && active) {
    const int slot = static_cast<int>(token);
    const int seq = slot / p.mixed_queries, t = slot % p.mixed_queries;
    const QueryRange qr =
        clamp_query_range(p.kv.cu_seqlens_q[seq], p.kv.cu_seqlens_q[seq + 1], p.num_tokens);
    active = qr.count <= p.mixed_queries && t < qr.count;
    token = qr.begin + t;
  }
  const int64_t safe_row = active ? row : num_rows - 1;
  const int S = p.num_splits;
  // A head dim below HEAD_DIM (tile_table.h): partial rows of head_dim
  // floats; the lanes past it load nothing and store nothing.
  const int hd = p.kv.head_dim;
  const bool lane_on = lane * C < hd;
  const float* lse_in = p.partial_lse + row;                                 // split s at [s * num_rows]
  const float* out_in = p.partial_out + safe_row * hd + (lane_on ? lane * C : 0);  // split s at [s * split_stride]
  const int64_t split_stride = num_rows * hd;

  float acc[C];
#pragma unroll
  for (int i = 0; i < C; ++i) acc[i] = 0.f;
  float run_max = -INFINITY;  // largest lse so far (the same in all lanes of the row)
  float den = 0.f;            // sum of exp(lse - run_max) so far

  // Splits in chunks of R: lane j holds the lse of split c0 + j. With up to R
  // splits (decode: up to 32) there is one chunk and no rescaling. Loads go
  // out a batch of kSplitBatch splits per lane at a time; a chunk's first
  // batch leaves together with its lse loads (its addresses do not depend on
  // them): they share one round trip.
  // Splits past num_splits, and every split of an inactive row (a mixed
  // step's slots without a decode query hold no partials), read as zeros
  // (weight 0): their loads are predicated off, with no branch between the
  // loads, and each address is the
  // previous one plus the split stride. (With each split's address its own
  // 64-bit product of an index clamped into range, ptxas issues the batch
  // after the lse reduction, a round trip later: about 1 us more of combine
  // after the decode kernel, for one sequence at 32k positions on the H200.)
  float4 v[B][V];
  uint32_t live = ~0u;  // kLseGated: bit j, split c0 + j of the chunk has a finite lse
  auto load_batch = [&](int s0) {
    const float4* src = reinterpret_cast<const float4*>(out_in + s0 * split_stride);
#pragma unroll
    for (int u = 0; u < B; ++u) {
      const bool on = active && lane_on && s0 + u < S && (!kLseGated || (live >> ((s0 + u) % R)) & 1u);
#pragma unroll
      for (int k = 0; k < V; ++k) v[u][k] = on ? __ldg(src + k) : make_float4(0.f, 0.f, 0.f, 0.f);
      src += split_stride / 4;
    }
  };
  int last = R - 1;  // the chunk's last split read (warp-uniform)
  for (int c0 = wr * R; c0 < S; c0 += W * R) {
    const int s_mine = c0 + lane;
    const float l = (active && s_mine < S) ? lse_in[static_cast<int64_t>(s_mine) * num_rows] : -INFINITY;
    if constexpr (kLseGated) {
      // This row's lanes' bits, and the last live split of any row of the warp.
      const uint32_t ballot = __ballot_sync(0xffffffffu, merges_split(l));
      const int shift = R == 32 ? 0 : static_cast<int>(threadIdx.x % 32) / R * R;
      const uint32_t mask = R == 32 ? ~0u : (1u << (R % 32)) - 1u;
      live = (ballot >> shift) & mask;
      uint32_t any = ballot;
      for (int o = R; o < 32; o += R) any |= ballot >> o;
      last = 31 - __clz(any & mask);  // -1 when no split is live
    }
    load_batch(c0);
    float w = 0.f;     // split s_mine's weight (ungated)
    MergeStep step{};  // kLseGated: split s_mine's step, from the running maximum before it
    if constexpr (kLseGated) {
      float upto = l;  // the chunk's maximum up to split s_mine
#pragma unroll
      for (int o = 1; o < R; o <<= 1) {
        const float x = __shfl_up_sync(0xffffffffu, upto, o, R);
        if (lane >= o) upto = fmaxf(upto, x);
      }
      upto = merged_max(run_max, upto);
      float before = __shfl_up_sync(0xffffffffu, upto, 1, R);
      if (lane == 0) before = run_max;
      step = merge_step(before, l);
      run_max = __shfl_sync(0xffffffffu, upto, R - 1, R);
    } else {
      const float new_max = fmaxf(run_max, warp_max<R>(l));
      // Subtract a finite base so that all-neutral chunks give weights 0, not NaN (-inf - -inf).
      const float base = new_max == -INFINITY ? 0.f : new_max;
      const float rescale = exp2f((run_max - base) * kLog2e);  // 1 if the max did not move; 0 at the start
      w = exp2f((l - base) * kLog2e);                           // 0 for neutral splits and s >= S
      den = den * rescale + warp_sum<R>(w);
      run_max = new_max;
#pragma unroll
      for (int i = 0; i < C; ++i) acc[i] *= rescale;
    }

    // Not unrolled: one batch in flight per lane, so registers stay low and
    // occupancy high (ptxas would hoist every batch).
#pragma unroll 1
    for (int j0 = 0; j0 < R; j0 += B) {
      if (c0 + j0 >= S || j0 > last) break;  // uniform: S is the same for every row, last for the warp
#pragma unroll
      for (int u = 0; u < B; ++u) {
        if constexpr (kLseGated) {
          const float lj = __shfl_sync(0xffffffffu, l, j0 + u, R);
          MergeStep sj;
          sj.r = __shfl_sync(0xffffffffu, step.r, j0 + u, R);
          sj.w = __shfl_sync(0xffffffffu, step.w, j0 + u, R);
          if (merges_split(lj)) {  // the same for the row's lanes (the warp's other row may differ)
            den = merge_den(den, sj);
#pragma unroll
            for (int k = 0; k < V; ++k) {
              acc[4 * k + 0] = merge_acc(acc[4 * k + 0], v[u][k].x, sj);
              acc[4 * k + 1] = merge_acc(acc[4 * k + 1], v[u][k].y, sj);
              acc[4 * k + 2] = merge_acc(acc[4 * k + 2], v[u][k].z, sj);
              acc[4 * k + 3] = merge_acc(acc[4 * k + 3], v[u][k].w, sj);
            }
          }
        } else {
          const float wj = __shfl_sync(0xffffffffu, w, j0 + u, R);
#pragma unroll
          for (int k = 0; k < V; ++k) {
            acc[4 * k + 0] = fmaf(wj, v[u][k].x, acc[4 * k + 0]);
            acc[4 * k + 1] = fmaf(wj, v[u][k].y, acc[4 * k + 1]);
            acc[4 * k + 2] = fmaf(wj, v[u][k].z, acc[4 * k + 2]);
            acc[4 * k + 3] = fmaf(wj, v[u][k].w, acc[4 * k + 3]);
          }
        }
      }
      if (j0 + B < R && c0 + j0 + B < S) load_batch(c0 + j0 + B);  // the chunk's next batch
    }
  }
  if constexpr (W > 1) {
    // Warp 0 merges the warps' (max, sum, acc), in warp order.
    __shared__ float sh_max[W][Traits::kWarpRows], sh_den[W][Traits::kWarpRows];
    __shared__ float4 sh_acc[W][32][V];
    const int wl = threadIdx.x % 32;
    if (lane == 0) {
      sh_max[wr][block_row] = run_max;
      sh_den[wr][block_row] = den;
    }
#pragma unroll
    for (int k = 0; k < V; ++k)
      sh_acc[wr][wl][k] = make_float4(acc[4 * k], acc[4 * k + 1], acc[4 * k + 2], acc[4 * k + 3]);
    __syncthreads();
    if (wr != 0) return;
    run_max = -INFINITY;
#pragma unroll
    for (int x = 0; x < W; ++x) run_max = fmaxf(run_max, sh_max[x][block_row]);
    const float base = run_max == -INFINITY ? 0.f : run_max;
    den = 0.f;
#pragma unroll
    for (int i = 0; i < C; ++i) acc[i] = 0.f;
#pragma unroll
    for (int x = 0; x < W; ++x) {
      const float f = exp2f((sh_max[x][block_row] - base) * kLog2e);  // 0 for a warp without a live split
      den = fmaf(sh_den[x][block_row], f, den);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float4 a = sh_acc[x][wl][k];
        acc[4 * k + 0] = fmaf(a.x, f, acc[4 * k + 0]);
        acc[4 * k + 1] = fmaf(a.y, f, acc[4 * k + 1]);
        acc[4 * k + 2] = fmaf(a.z, f, acc[4 * k + 2]);
        acc[4 * k + 3] = fmaf(a.w, f, acc[4 * k + 3]);
      }
    }
  }
  if (!active) return;

  // den >= 1 when any split saw a position; 0 when all were neutral: then the
  // row is 0, whatever the (weight-0) partial outputs held, NaN included.
  float lse_out;
  if constexpr (kLseGated) {
    const float inv = merged_inv(den);
#pragma unroll
    for (int i = 0; i < C; ++i) acc[i] = merged_out(acc[i], den, inv);
    lse_out = merged_lse(run_max, den);
  } else {
    const float inv = den > 0.f ? 1.f / den : 0.f;
#pragma unroll
    for (int i = 0; i < C; ++i) acc[i] = den > 0.f ? acc[i] * inv : 0.f;
    lse_out = den > 0.f ? run_max + logf(den) : -INFINITY;
  }
  const int64_t h = row % p.num_q_heads;
  scalar_t* dst = static_cast<scalar_t*>(p.out) + token * p.o_stride_token + h * p.o_stride_head + lane * C;
  if (lane_on) store_channels<scalar_t, C>(dst, acc);
  if (p.lse != nullptr && lane == 0) p.lse[token * p.num_q_heads + h] = lse_out;
}

// Launches combine_kernel on `stream`; no-op for an empty output.
// `programmatic`: see launch_kernel (common.cuh); behind decode, whose blocks
// allow it at their epilogue, combine's blocks are resident before decode ends.
template <typename scalar_t, int HEAD_DIM>
cudaError_t launch_combine(const AttentionParams& p, cudaStream_t stream, bool programmatic) {
  using Traits = CombineTraits<HEAD_DIM>;
  const int64_t rows = static_cast<int64_t>(partial_rows(p)) * p.num_q_heads;
  if (rows == 0) return cudaSuccess;
  auto launch = [&](auto kernel, auto shape) {
    using Shape = decltype(shape);
    const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(rows, Shape::kRowsPerBlock)));
    return launch_kernel(kernel, grid, dim3(Shape::kThreads), 0, stream, programmatic, p);
  };
  using One = CombineShape<HEAD_DIM, 1>;
  constexpr int W = Traits::kWideWarps;
  using Wide = CombineShape<HEAD_DIM, W>;
  if (p.split_slots > 0) return launch(combine_kernel<scalar_t, HEAD_DIM, true, 1>, One{});
  if (p.num_splits > Traits::kLanesPerRow) return launch(combine_kernel<scalar_t, HEAD_DIM, false, W>, Wide{});
  return launch(combine_kernel<scalar_t, HEAD_DIM, false, 1>, One{});
}

}  // namespace tileinfer
