// Attention inputs: per-head RMSNorm, rotary embedding and the paged cache
// write (plain or int8-quantizing), as device functions over one head's row.
//
// The separate ops (rms_norm, rope, cache_write) and the fused attention_inputs
// are the same two kernels below with different stages switched on, so every
// value is computed by the same code in both paths: a stage takes and leaves
// values already rounded to the element type (held in fp32 registers, where
// that is exact), just as the separate ops leave them in memory. That is what
// makes the fused op bit-identical to the separate ones (SPEC section 2).
//
// Layout: a row (one head of one token, head_dim elements) is held by a group
// of kLanes threads, each with kVecs 16-byte vectors; lane l holds vectors
// l, l + kLanes, ... so that a group's loads are contiguous and coalesced. A
// group carries one or kMaxRowsPerGroup rows (rows_per_group). Groups never
// leave early: a row that is skipped (bad metadata, tail of the grid) still
// takes part in the warp shuffles and __syncwarp of its warp, and simply
// neither reads cos/sin nor stores.
//
// A block's row copies start first, into shared memory; then one thread per
// token finds the token's position (and cache slot), prefetches its cos/sin
// row and shares both with every head of the token in the block; then the
// groups run the stages. A row's metadata is thus one chain of loads per
// token, under the row's own copy, instead of one per row after it.
#pragma once

#include <type_traits>

#include "common.cuh"
#include "mma.cuh"
#include "paged_kv.cuh"

namespace tileinfer {

// 256 threads: 8 warps of 1 to 4 row groups each.
constexpr int kInputsThreads = 256;

// Rows a group carries. One row per thread at a time leaves too little in
// flight at copy speed on large steps: one row per group, each row followed
// by its own chain of dependent metadata and cos/sin loads, ran at 47% of
// copy bandwidth at 4096 tokens on an H200 (2026-11-29). Four rows per group
// held in registers, each still with its own metadata chain (one after the
// other in the thread), measured slower (10.7 vs 5.2 us for a 1-token step,
// 66 vs 50 us at 4096 tokens): occupancy and serialized chains. Now the rows
// wait in shared memory (cp.async, no registers) and the metadata is one
// chain per token, so a group can carry two rows at the occupancy of one.
// Small steps keep one row per group: latency wants the most blocks, each
// group on its first row at once (rows_per_group). Not yet run on a GPU.
constexpr int kMaxRowsPerGroup = 2;

// Blocks of one-row groups above which a step takes kMaxRowsPerGroup rows per
// group: about one wave of resident blocks on an H200 (132 SMs x 8). Below,
// the step is latency-bound and more blocks are better. Shapes only: a
// captured graph keeps its choice.
constexpr int64_t kOneRowMaxBlocks = 1024;
__host__ __device__ constexpr int rows_per_group(int64_t rows, int groups_per_block) {
  return ceil_div<int64_t>(rows, groups_per_block) > kOneRowMaxBlocks ? kMaxRowsPerGroup : 1;
}

// Where the rotary position of a token comes from.
enum class PosFrom {
  kNone,      // no rotation (rms_norm)
  kInt32,     // explicit positions [num_tokens] int32 (rope op)
  kInt64,     // explicit positions [num_tokens] int64 (rope op)
  kMetadata,  // seq_lens / cu_seqlens_q, as the cache write (attention_inputs)
};

// The rotary embedding's table: cos_sin[pos * stride + c], cos in
// [0, rotary_dim / 2), sin in [rotary_dim / 2, rotary_dim), fp32.
struct RopeTable {
  const float* cos_sin;  // [max_position, rotary_dim]
  int64_t stride;        // row stride (elements)
  int64_t max_position;  // rows: positions outside [0, max_position) are skipped
  int rotary_dim;        // even, <= head_dim
  bool vec_ok;           // rotary_dim / 2 is a multiple of the vector width and
                         // rows are 16-byte aligned: cos/sin load as float4
};

// Token rows in, token rows out: rms_norm, rope, and the queries half of
// attention_inputs. x, out: [num_tokens, num_heads, head_dim], last dim
// contiguous, strides in elements (16-byte multiples, checked on the host).
struct RowsParams {
  const void* x;
  int64_t x_stride_token, x_stride_head;
  void* out;                  // may be x (in place)
  int64_t out_stride_token, out_stride_head;
  const void* weight;         // [head_dim] norm weight, element type, or null
  float eps;
  RopeTable rope;
  const void* positions;      // [num_tokens] int32/int64 (PosFrom::kInt32/kInt64)
  PagedKVParams kv;           // metadata only (PosFrom::kMetadata)
  int num_tokens;
  int num_heads;
  int rows_per_group;         // 1 or kMaxRowsPerGroup, from the shapes (rows_per_group)
};

// Keys and values into the cache: cache_write, and the keys+values half of
// attention_inputs. One group handles the key and the value row of one
// (token, kv_head). kv carries the read-only view of the pools shared with the
// attention kernels; the writable pointers to the same pools are here.
struct KVWriteParams {
  PagedKVParams kv;
  void* k_pool;               // [num_pages, num_kv_heads, page_size, head_dim]
  void* v_pool;
  float* k_scale;             // [num_pages, num_kv_heads, page_size], int8 only
  float* v_scale;
  const float* k_smooth;      // [num_kv_heads, head_dim] or null, int8 only
  const void* k;              // [num_tokens, num_kv_heads, head_dim]
  int64_t k_stride_token, k_stride_head;
  const void* v;
  int64_t v_stride_token, v_stride_head;
  const void* k_weight;       // [head_dim] key norm weight or null (attention_inputs)
  float eps;
  RopeTable rope;             // used when the kernel rotates keys
  int num_tokens;
  int rows_per_group;         // 1 or kMaxRowsPerGroup, from the shapes (rows_per_group)
};

// How a row of D elements of T spreads over a group of threads.
template <typename T, int D>
struct RowLayout {
  static constexpr int kVec = 16 / sizeof(T);          // elements per 16-byte vector
  static constexpr int kRowVecs = D / kVec;            // vectors per row
  static constexpr int kLanes = kRowVecs < 32 ? kRowVecs : 32;
  static constexpr int kVecs = kRowVecs / kLanes;      // vectors per lane
  static constexpr int kElems = kVecs * kVec;          // elements per lane
  static constexpr int kGroups = kInputsThreads / kLanes;           // groups per block
  static constexpr int kMaxRowsPerBlock = kGroups * kMaxRowsPerGroup;
  static_assert(D % kVec == 0 && kRowVecs % kLanes == 0, "head_dim must be a multiple of the vector width");
  static_assert(32 % kLanes == 0, "a group must not straddle warps");
  static_assert(kMaxRowsPerBlock <= kInputsThreads, "one thread per token of a block");

  // First column of the lane's i-th vector.
  __device__ static int col(int lane, int i) { return (lane + i * kLanes) * kVec; }
};

// The place of a token in its sequence and in the cache.
struct TokenPlace {
  int64_t pos;  // position in the sequence; -1 for a token of no sequence
  int page;     // page id, or -1: nothing may be written for this token
  int slot;     // slot within the page
};

// Token t of sequence s sits at position seq_lens[s] - n_s + t (SPEC section 1);
// -1 for a token of no sequence. seq_lens is taken as it is (not clamped), so
// positions match the reference; callers range-check what they use it for.
__device__ __forceinline__ int64_t token_position(const PagedKVParams& p, int token, int* seq_out) {
  *seq_out = -1;
  if (p.num_seqs <= 0) return -1;
  // Decode steps (one token per sequence) have token t in sequence t: that
  // guess first. With non-decreasing cu_seqlens_q only one sequence holds the
  // token, so the guess, when it holds, is the search's answer. A candidate's
  // bounds and seq_lens entry are read in one round, before it is known to
  // hold the token: a decode token's position costs one round of loads, a
  // prefill token's the search's log2(num_seqs) plus one.
  const bool guess = token < p.num_seqs;
  int seq = guess ? token : seq_search(p, token);
  int begin = p.cu_seqlens_q[seq], end = p.cu_seqlens_q[seq + 1], len = p.seq_lens[seq];
  if (guess && !(begin <= token && token < end)) {
    seq = seq_search(p, token);
    begin = p.cu_seqlens_q[seq], end = p.cu_seqlens_q[seq + 1], len = p.seq_lens[seq];
  }
  if (!(begin <= token && token < end)) return -1;
  *seq_out = seq;
  return static_cast<int64_t>(len) - (static_cast<int64_t>(end) - begin) + (token - begin);
}

// Starts fetching bytes [0, n) from `p` into L1 (and L2), one thread per
// 128-byte line from `first` on, `step` threads apart: data that every group
// needs only after the block's barrier is then on its way during the metadata
// round, and a prefetch holds no register and stalls nothing. Addresses stay
// inside the range (the last line is covered by the range's last byte).
__device__ __forceinline__ void prefetch_l1(const void* p, int n, int first, int step) {
  const char* c = static_cast<const char*>(p);
  for (int o = first * 128; o < n + 127; o += step * 128)
    asm volatile("prefetch.global.L1 [%0];" ::"l"(c + (o < n ? o : n - 1)));
}

// A position's row of the cos/sin table, prefetched as soon as the position
// is known, by the thread that found it.
__device__ __forceinline__ void prefetch_rope_row(const RopeTable& rt, int64_t pos) {
  prefetch_l1(rt.cos_sin + pos * rt.stride, rt.rotary_dim * static_cast<int>(sizeof(float)), 0, 1);
}

// Where a token goes in the cache: a position outside what the block table
// holds, or on a page id outside the pool, gets page = -1 (skipped; the Python
// validate_metadata helper reports such entries). ROPE: the keys are rotated
// with `rope`, whose row is prefetched while the block table is read.
template <bool ROPE>
__device__ __forceinline__ TokenPlace place_of_token(const PagedKVParams& p, int token, const RopeTable& rope) {
  int seq;
  TokenPlace r{token_position(p, token, &seq), -1, 0};
  if (seq < 0 || r.pos < 0 || r.pos >= static_cast<int64_t>(p.max_pages) * p.page_size) return r;
  if (ROPE && r.pos < rope.max_position) prefetch_rope_row(rope, r.pos);
  // Below max_pages * page_size, which the host keeps within int32.
  const int pos = static_cast<int>(r.pos);
  r.page = page_of(p, seq, pos / p.page_size);
  r.slot = pos % p.page_size;
  return r;
}

// ---------------------------------------------------------------------------
// Loads and stores of a lane's part of a row.

template <typename T, int D>
__device__ __forceinline__ void load_row(float (&x)[RowLayout<T, D>::kElems], const T* row, int lane) {
  using L = RowLayout<T, D>;
#pragma unroll
  for (int i = 0; i < L::kVecs; ++i) {
    const Vec16<T> v = *reinterpret_cast<const Vec16<T>*>(row + L::col(lane, i));
#pragma unroll
    for (int e = 0; e < L::kVec; ++e) x[i * L::kVec + e] = to_float(v.v[e]);
  }
}

// Starts copying a lane's part of a row into the group's staging slot in
// shared memory (zeros when !valid; `row` must be a readable row either way).
// A copy on its way holds no register, so a group can have several rows in
// flight at the register cost of one. Each lane reads back only the vectors
// it copied, so waiting for its own copies is all the ordering needed.
template <typename T, int D>
__device__ __forceinline__ void stage_row(T* slot, const T* row, bool valid, int lane) {
  using L = RowLayout<T, D>;
#pragma unroll
  for (int i = 0; i < L::kVecs; ++i) cp_async_16(slot + L::col(lane, i), row + L::col(lane, i), valid);
}

// x holds values of T (rounded already), so the conversion is exact.
template <typename T, int D>
__device__ __forceinline__ void store_row(T* row, const float (&x)[RowLayout<T, D>::kElems], int lane) {
  using L = RowLayout<T, D>;
#pragma unroll
  for (int i = 0; i < L::kVecs; ++i) {
    Vec16<T> v;
#pragma unroll
    for (int e = 0; e < L::kVec; ++e) v.v[e] = from_float<T>(x[i * L::kVec + e]);
    *reinterpret_cast<Vec16<T>*>(row + L::col(lane, i)) = v;
  }
}

template <typename T>
__device__ __forceinline__ float round_to(float x) {
  return to_float(from_float<T>(x));
}

// ---------------------------------------------------------------------------
// Stages. Each takes and leaves values of T (in fp32 registers).

// Qwen3's RMSNorm: sum of squares in fp32 (each lane its elements in order,
// then a butterfly over the group: a fixed order, so the same row gives the
// same bits in every kernel), normalized value rounded to T, then times the
// weight in T (one fp32 product rounded to T, as `weight * h.to(dtype)` in
// eager PyTorch). rsqrtf as PyTorch's CUDA rsqrt.
template <typename T, int D>
__device__ __forceinline__ void rms_norm_stage(float (&x)[RowLayout<T, D>::kElems], const T* weight, float eps,
                                               int lane) {
  using L = RowLayout<T, D>;
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < L::kElems; ++i) ss = fmaf(x[i], x[i], ss);
  ss = warp_sum<L::kLanes>(ss);
  // D is a power of two: the mean is exact as a product.
  const float inv = rsqrtf(__fadd_rn(__fmul_rn(ss, 1.f / D), eps));
#pragma unroll
  for (int i = 0; i < L::kVecs; ++i) {
    const Vec16<T> w = *reinterpret_cast<const Vec16<T>*>(weight + L::col(lane, i));
#pragma unroll
    for (int e = 0; e < L::kVec; ++e) {
      float& v = x[i * L::kVec + e];
      v = round_to<T>(__fmul_rn(to_float(w.v[e]), round_to<T>(__fmul_rn(v, inv))));
    }
  }
}

// Neox (rotate-half) rotary embedding: channel c < h = rotary_dim / 2 pairs with
// c + h. y_c = x_c cos - x_{c+h} sin, y_{c+h} = x_{c+h} cos + x_c sin, each
// product rounded to fp32 before the sum (as the eager reference computes it:
// __fmul_rn keeps the compiler from fusing them into an fma), rounded once to T.
// Channels past rotary_dim are kept. The partner of a channel usually lives in
// another lane, so the row goes through shared memory (`row`, D floats of this
// group). cs: the position's row of the table, or null to skip the math (the
// group still takes part in __syncwarp).
template <typename T, int D>
__device__ __forceinline__ void rope_stage(float (&x)[RowLayout<T, D>::kElems], float* row, const float* cs,
                                           const RopeTable& rt, int lane) {
  using L = RowLayout<T, D>;
#pragma unroll
  for (int i = 0; i < L::kVecs; ++i)
#pragma unroll
    for (int e = 0; e < L::kVec; e += 4) {
      const int j = i * L::kVec + e;
      *reinterpret_cast<float4*>(row + L::col(lane, i) + e) = make_float4(x[j], x[j + 1], x[j + 2], x[j + 3]);
    }
  __syncwarp();
  if (cs != nullptr) {
    const int half = rt.rotary_dim / 2;
#pragma unroll
    for (int i = 0; i < L::kVecs; ++i) {
      const int c0 = L::col(lane, i);
      if (c0 >= rt.rotary_dim) continue;
      if (rt.vec_ok) {
        // The vector lies wholly in one half: cos/sin/partner are 16-byte runs,
        // taken four channels at a time (fewer registers at once).
        const bool first = c0 < half;
        const int base = first ? c0 : c0 - half;  // index into the cos half
        const int part = first ? c0 + half : c0 - half;
#pragma unroll
        for (int e = 0; e < L::kVec; e += 4) {
          const float4 c = __ldg(reinterpret_cast<const float4*>(cs + base + e));
          const float4 s = __ldg(reinterpret_cast<const float4*>(cs + half + base + e));
          const float4 o = *reinterpret_cast<const float4*>(row + part + e);
          const float cosv[4] = {c.x, c.y, c.z, c.w}, sinv[4] = {s.x, s.y, s.z, s.w}, other[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            float& v = x[i * L::kVec + e + j];
            v = first ? round_to<T>(__fsub_rn(__fmul_rn(v, cosv[j]), __fmul_rn(other[j], sinv[j])))
                      : round_to<T>(__fadd_rn(__fmul_rn(v, cosv[j]), __fmul_rn(other[j], sinv[j])));
          }
        }
      } else {
        // Any even rotary_dim: channel by channel.
#pragma unroll
        for (int e = 0; e < L::kVec; ++e) {
          const int c = c0 + e;
          float& v = x[i * L::kVec + e];
          if (c < half) {
            v = round_to<T>(__fsub_rn(__fmul_rn(v, __ldg(cs + c)), __fmul_rn(row[c + half], __ldg(cs + half + c))));
          } else if (c < rt.rotary_dim) {
            v = round_to<T>(__fadd_rn(__fmul_rn(v, __ldg(cs + c - half)), __fmul_rn(row[c - half], __ldg(cs + c))));
          }
        }
      }
    }
  }
  __syncwarp();  // every lane has read its partners before the buffer takes the next row
}

// Symmetric per-vector int8 quantization of a row: keys divided by their
// smoothing factors first (smooth: the head's [head_dim] row, or null), scale =
// amax / 127 (1 for an all-zero vector), q = round-half-even(x / scale) clamped
// to +-127. Every division is IEEE (__fdiv_rn), as the reference's. Stores when
// `dst` is not null; returns the scale.
template <typename T, int D>
__device__ __forceinline__ float quantize_stage(const float (&x)[RowLayout<T, D>::kElems], const float* smooth,
                                                int8_t* dst, int lane) {
  using L = RowLayout<T, D>;
  float src[L::kElems];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < L::kVecs; ++i)
#pragma unroll
    for (int e = 0; e < L::kVec; ++e) {
      const int j = i * L::kVec + e;
      src[j] = smooth != nullptr ? __fdiv_rn(x[j], __ldg(smooth + L::col(lane, i) + e)) : x[j];
      amax = fmaxf(amax, fabsf(src[j]));
    }
  amax = warp_max<L::kLanes>(amax);
  const float scale = amax > 0.f ? __fdiv_rn(amax, 127.f) : 1.f;
  if (dst != nullptr) {
#pragma unroll
    for (int i = 0; i < L::kVecs; ++i) {
      // kVec int8 values: 8 bytes (16-bit T) or 4 bytes (fp32), one store.
      union {
        int8_t b[L::kVec];
        typename std::conditional<L::kVec == 8, uint2, uint32_t>::type w;
      } pack;
#pragma unroll
      for (int e = 0; e < L::kVec; ++e) {
        const float q = rintf(__fdiv_rn(src[i * L::kVec + e], scale));
        pack.b[e] = static_cast<int8_t>(fminf(127.f, fmaxf(-127.f, q)));
      }
      *reinterpret_cast<decltype(pack.w)*>(dst + L::col(lane, i)) = pack.w;
    }
  }
  return scale;
}

// ---------------------------------------------------------------------------
// Kernels.

// The rows of a block over a [num_tokens, num_heads] grid: the kGroups * rpg
// rows from blockIdx.x * kGroups * rpg on (rpg: rows per group, see
// rows_per_group), group g carrying rows g, g + kGroups, ... of them (a warp's
// copies of one round are contiguous). The rows touch `tokens` consecutive
// tokens from token0 (at most one per row).
struct BlockRows {
  int token0;
  int tokens;
  int head0;  // head of the block's first row
  int rpg;
};
// The host checks keep num_tokens * num_heads below 2^31, so the block's first
// row fits an int and 32-bit divisions do.
template <int kGroups>
__device__ __forceinline__ BlockRows block_rows(int rpg, int num_tokens, int num_heads) {
  const unsigned rows = static_cast<unsigned>(kGroups * rpg);
  const unsigned first = blockIdx.x * rows;
  const unsigned heads = static_cast<unsigned>(num_heads);
  BlockRows b;
  b.token0 = static_cast<int>(first / heads);
  const int last = static_cast<int>((first + rows - 1) / heads);
  b.tokens = (last < num_tokens ? last + 1 : num_tokens) - b.token0;
  b.head0 = static_cast<int>(first % heads);
  b.rpg = rpg;
  return b;
}

// Row r of a group: local is its token minus token0 (the index of the token's
// entry in the block's metadata), in_range whether it exists. A row that does
// not (r >= rpg, past the last token) gets local and head 0: a row that does.
struct GroupRow {
  int local;
  int head;
  bool in_range;
};
template <int kGroups>
__device__ __forceinline__ GroupRow group_row(const BlockRows& b, int r, int group, int num_heads) {
  const int o = b.head0 + r * kGroups + group;
  const bool in_range = r < b.rpg && o / num_heads < b.tokens;
  return {in_range ? o / num_heads : 0, in_range ? o % num_heads : 0, in_range};
}

// Rows of a token tensor: optional RMSNorm, optional rotation, store. Grid:
// ceil(num_tokens * num_heads / (kGroups * rows_per_group)) blocks of
// kInputsThreads. A row is written unless its rotation has no valid position
// (explicit position outside the table; with kMetadata also a token of no
// sequence).
template <typename T, int D, bool NORM, PosFrom POS>
__global__ void __launch_bounds__(kInputsThreads) rows_kernel(const RowsParams p) {
  using L = RowLayout<T, D>;
  constexpr int R = kMaxRowsPerGroup;
  constexpr bool kRope = POS != PosFrom::kNone;
  const int group = threadIdx.x / L::kLanes;
  const int lane = threadIdx.x % L::kLanes;
  const BlockRows b = block_rows<L::kGroups>(p.rows_per_group, p.num_tokens, p.num_heads);

  // The rows first: their copies do not wait for the metadata.
  __shared__ __align__(16) T stage[R][L::kGroups][D];
  for (int r = 0; r < b.rpg; ++r) {
    const GroupRow g = group_row<L::kGroups>(b, r, group, p.num_heads);
    stage_row<T, D>(stage[r][group],
                    static_cast<const T*>(p.x) + (b.token0 + g.local) * p.x_stride_token + g.head * p.x_stride_head,
                    g.in_range, lane);
  }
  cp_async_commit();
  if constexpr (NORM) prefetch_l1(p.weight, D * sizeof(T), threadIdx.x, kInputsThreads);

  // Each token's position once, by one thread, for all its heads in the block.
  __shared__ int64_t pos_of[kRope ? L::kMaxRowsPerBlock : 1];
  if constexpr (kRope) {
    if (threadIdx.x < b.tokens) {
      const int t = b.token0 + threadIdx.x;
      int64_t pos;
      if constexpr (POS == PosFrom::kInt32) {
        pos = static_cast<const int32_t*>(p.positions)[t];
      } else if constexpr (POS == PosFrom::kInt64) {
        pos = static_cast<const int64_t*>(p.positions)[t];
      } else {
        int seq;
        pos = token_position(p.kv, t, &seq);  // -1 for no sequence
      }
      if (pos >= 0 && pos < p.rope.max_position) prefetch_rope_row(p.rope, pos);
      pos_of[threadIdx.x] = pos;
    }
  }
  cp_async_wait<0>();
  if constexpr (kRope) __syncthreads();

  __shared__ __align__(16) float rows[kRope ? L::kGroups : 1][kRope ? D : 4];
  // One row at a time (not unrolled): the registers of one row.
#pragma unroll 1
  for (int r = 0; r < b.rpg; ++r) {
    const GroupRow g = group_row<L::kGroups>(b, r, group, p.num_heads);
    bool write = g.in_range;
    int64_t pos = 0;
    if constexpr (kRope) {
      pos = pos_of[g.local];
      write = write && pos >= 0 && pos < p.rope.max_position;
    }
    float x[L::kElems];
    load_row<T, D>(x, stage[r][group], lane);
    if constexpr (NORM) rms_norm_stage<T, D>(x, static_cast<const T*>(p.weight), p.eps, lane);
    if constexpr (kRope) {
      const float* cs = write ? p.rope.cos_sin + pos * p.rope.stride : nullptr;
      rope_stage<T, D>(x, rows[group], cs, p.rope, lane);
    }
    if (write) {
      store_row<T, D>(static_cast<T*>(p.out) + (b.token0 + g.local) * p.out_stride_token + g.head * p.out_stride_head,
                      x, lane);
    }
  }
}

// Resident blocks per SM the kv kernel is compiled for: the rotation or the
// quantization want more than 32 registers; left free, ptxas takes up to 60
// for some variants (4 blocks), while 48 holds all of them without spills.
template <bool kHeavy>
constexpr int kKVMinBlocks = kHeavy ? 5 : 8;

// Keys and values of one (token, kv_head) per row into their cache slot:
// optional key RMSNorm and rotation (attention_inputs), then a plain or int8
// store of both. Nothing is written for a token of no sequence, a position
// outside the block table or on a page id outside the pool, and (ROPE) a
// position outside the cos/sin table. Grid: ceil(num_tokens * num_kv_heads /
// (kGroups * rows_per_group)) blocks of kInputsThreads.
template <typename T, int D, bool NORM, bool ROPE, bool INT8>
__global__ void __launch_bounds__(kInputsThreads, kKVMinBlocks<ROPE || INT8>) kv_write_kernel(const KVWriteParams p) {
  using L = RowLayout<T, D>;
  constexpr int R = kMaxRowsPerGroup;
  const int group = threadIdx.x / L::kLanes;
  const int lane = threadIdx.x % L::kLanes;
  const BlockRows b = block_rows<L::kGroups>(p.rows_per_group, p.num_tokens, p.kv.num_kv_heads);

  __shared__ __align__(16) T stage_k[R][L::kGroups][D];
  __shared__ __align__(16) T stage_v[R][L::kGroups][D];
  for (int r = 0; r < b.rpg; ++r) {
    const GroupRow g = group_row<L::kGroups>(b, r, group, p.kv.num_kv_heads);
    const int t = b.token0 + g.local;
    stage_row<T, D>(stage_k[r][group], static_cast<const T*>(p.k) + t * p.k_stride_token + g.head * p.k_stride_head,
                    g.in_range, lane);
    stage_row<T, D>(stage_v[r][group], static_cast<const T*>(p.v) + t * p.v_stride_token + g.head * p.v_stride_head,
                    g.in_range, lane);
  }
  cp_async_commit();
  if constexpr (NORM) prefetch_l1(p.k_weight, D * sizeof(T), threadIdx.x, kInputsThreads);

  // Each token's slot once, by one thread, for all its heads in the block.
  __shared__ TokenPlace place_of[L::kMaxRowsPerBlock];
  if (threadIdx.x < b.tokens) place_of[threadIdx.x] = place_of_token<ROPE>(p.kv, b.token0 + threadIdx.x, p.rope);
  cp_async_wait<0>();
  __syncthreads();

  __shared__ __align__(16) float rows[ROPE ? L::kGroups : 1][ROPE ? D : 4];
  // One row at a time (not unrolled): the registers of one row.
#pragma unroll 1
  for (int r = 0; r < b.rpg; ++r) {
    const GroupRow g = group_row<L::kGroups>(b, r, group, p.kv.num_kv_heads);
    const TokenPlace place = g.in_range ? place_of[g.local] : TokenPlace{-1, -1, 0};
    bool write = place.page >= 0;
    if constexpr (ROPE) write = write && place.pos < p.rope.max_position;  // pos >= 0 when page >= 0
    float k[L::kElems], v[L::kElems];
    load_row<T, D>(k, stage_k[r][group], lane);
    load_row<T, D>(v, stage_v[r][group], lane);
    if constexpr (NORM) rms_norm_stage<T, D>(k, static_cast<const T*>(p.k_weight), p.eps, lane);
    if constexpr (ROPE) {
      const float* cs = write ? p.rope.cos_sin + place.pos * p.rope.stride : nullptr;
      rope_stage<T, D>(k, rows[group], cs, p.rope, lane);
    }
    const int head = g.head;
    const int64_t at = write ? scale_offset(p.kv, place.page, head, place.slot) : 0;  // vector index
    if constexpr (INT8) {
      const float* smooth = p.k_smooth != nullptr ? p.k_smooth + static_cast<int64_t>(head) * D : nullptr;
      int8_t* kd = write ? static_cast<int8_t*>(p.k_pool) + at * D : nullptr;
      int8_t* vd = write ? static_cast<int8_t*>(p.v_pool) + at * D : nullptr;
      const float ks = quantize_stage<T, D>(k, smooth, kd, lane);
      const float vs = quantize_stage<T, D>(v, nullptr, vd, lane);
      if (write && lane == 0) {
        p.k_scale[at] = ks;
        p.v_scale[at] = vs;
      }
    } else if (write) {
      store_row<T, D>(static_cast<T*>(p.k_pool) + at * D, k, lane);
      store_row<T, D>(static_cast<T*>(p.v_pool) + at * D, v, lane);
    }
  }
}

}  // namespace tileinfer
