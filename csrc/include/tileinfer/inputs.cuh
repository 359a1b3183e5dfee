// Attention inputs: per-head RMSNorm, rotary embedding and the paged cache
// write (plain or quantizing: int8, fp8), as device functions over one head's row.
//
// The separate ops (rms_norm, rope, cache_write) and the fused attention_inputs
// are the same two kernels below with different stages switched on, so every
// value is computed by the same code in both paths: a stage takes and leaves
// values already rounded to the element type (held as pairs of T, ElemPair),
// just as the separate ops leave them in memory. That is what makes the fused
// op bit-identical to the separate ones.
//
// Layout: a row (one head of one token, head_dim elements) is held by a group
// of kLanes threads, each with kVecs 16-byte vectors; lane l holds vectors
// l, l + kLanes, ... of each half of the row, so that a group's loads are
// contiguous and coalesced (RowLayout). A
// group works on one row at a time (rows_kernel: several consecutive rows in
// turn). Groups never leave early: a row that is skipped (bad metadata, past
// the end) still takes part in the warp shuffles and __syncwarp of its warp,
// and simply neither reads cos/sin nor stores.
#pragma once

#include <cstring>
#include <type_traits>

#include "common.cuh"
#include "paged_kv.cuh"
#include "quant.cuh"

namespace tileinfer {

// 256 threads: 8 warps of 1 to 4 row groups each.
constexpr int kInputsThreads = 256;

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
  // attention_inputs' explicit rotary positions [num_tokens] (int64 when
  // positions64, else int32), or null: rotate at the slot position.
  const void* positions;
  bool positions64;
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
  int rows_per_group;         // consecutive rows a thread group takes in turn (rows_per_group_for)
};

// Keys and values into the cache: cache_write, and the keys+values half of
// attention_inputs. One group handles the key and the value row of one
// (token, kv_head). kv carries the read-only view of the pools shared with the
// attention kernels; the writable pointers to the same pools are here.
struct KVWriteParams {
  PagedKVParams kv;
  void* k_pool;               // [num_pages, num_kv_heads, page_size, head_dim]
  void* v_pool;
  float* k_scale;             // [num_pages, num_kv_heads, page_size] or [1] (kv.scale_per_tensor), quantized only
  float* v_scale;
  const float* k_smooth;      // [num_kv_heads, head_dim] or null, quantized only
  const void* k;              // [num_tokens, num_kv_heads, head_dim]
  int64_t k_stride_token, k_stride_head;
  const void* v;
  int64_t v_stride_token, v_stride_head;
  const void* k_weight;       // [head_dim] key norm weight or null (attention_inputs)
  float eps;
  RopeTable rope;             // used when the kernel rotates keys
  int num_tokens;
  bool after_queries;         // launched right behind attention_inputs' rows_kernel (see kv_write_kernel)
};

// How a row of D elements of T spreads over a group of threads: lane l holds
// vector v of the first half of the row and vector v of the second half
// together (column c and c + D / 2: rotary partners, for a full-width
// rotation, with no exchange through shared memory), and the per-row work
// (metadata, sums, addresses) is repeated by half as many lanes as with one
// vector per lane. A group has a power-of-two number of lanes (a group never
// straddles warps) of up to 32: half the row's vectors rounded up, so a head
// dim whose half is not a power of two of vectors (80, 96) leaves the last
// lanes of its group without a vector (d 80 bf16: 5 of 8 lanes hold one);
// their vectors read as zeros and are never stored (active()).
constexpr int pow2_at_least(int n) { return n <= 1 ? 1 : 2 * pow2_at_least((n + 1) / 2); }

template <typename T, int D>
struct RowLayout {
  static constexpr int kVec = 16 / sizeof(T);          // elements per 16-byte vector
  static constexpr int kRowVecs = D / kVec;            // vectors per row
  static constexpr int kHalfVecs = kRowVecs / 2;       // vectors per half row
  static constexpr int kLanes = kHalfVecs >= 32 ? 32 : pow2_at_least(kHalfVecs);
  static constexpr int kHalfSlots = (kHalfVecs + kLanes - 1) / kLanes;  // vectors per lane per half
  static constexpr int kVecs = 2 * kHalfSlots;         // vectors per lane
  static constexpr int kElems = kVecs * kVec;          // elements per lane
  static constexpr int kPairs = kElems / 2;            // pairs of adjacent elements per lane (ElemPair)
  static constexpr int kGroups = kInputsThreads / kLanes;           // groups per block
  static_assert(D % (2 * kVec) == 0, "head_dim must be a multiple of two vector widths");
  static_assert(kHalfVecs <= 32 || kHalfVecs % 32 == 0, "whole lanes past 32 vectors per half");
  static_assert(32 % kLanes == 0, "a group must not straddle warps");

  // Index of the lane's i-th vector in its half, and whether the row has it.
  // Vector i + kVecs / 2 (second half) is the rotary partner of vector i.
  __device__ static int half_index(int lane, int i) { return lane + (i % kHalfSlots) * kLanes; }
  __device__ static bool active(int lane, int i) { return half_index(lane, i) < kHalfVecs; }
  // First column of the lane's i-th vector (meaningful when active).
  __device__ static int col(int lane, int i) { return (half_index(lane, i) + (i / kHalfSlots) * kHalfVecs) * kVec; }
};

// The place of a token in its sequence and in the cache.
struct TokenPlace {
  int64_t pos;  // position in the sequence; -1 for a token of no sequence
  int page;     // page id, or -1: nothing may be written for this token
  int slot;     // slot within the page
};

// Token t of sequence s sits at position seq_lens[s] - n_s + t;
// -1 for a token of no sequence. seq_lens is taken as it is (not clamped), so
// positions match the reference; callers range-check what they use it for.
__device__ __forceinline__ int64_t token_position(const PagedKVParams& p, int token, int* seq_out) {
  // The sequence s holding the token has cu[s] <= token < cu[s + 1]. Decode
  // steps (one token per sequence) have token t in sequence t: that guess is
  // checked first, else a binary search finds the last s with cu[s] <= token
  // (with non-decreasing cu_seqlens_q only one sequence holds the token, so a
  // guess that holds is the search's answer). Either way the candidate's
  // cu[s], cu[s + 1] and seq_lens[s] are loaded together, before any of them
  // is tested: one round trip, where loading seq_lens after the test (and
  // cu[s + 1] after cu[s]) took three, each a dependent step of the inputs
  // kernels' chain (metadata, cos / sin, block table).
  const int* cu = p.cu_seqlens_q;
  auto holds = [&](int s, int& begin, int& end, int& len) {
    begin = cu[s];
    end = cu[s + 1];
    len = p.seq_lens[s];
    return begin <= token && token < end;
  };
  int seq = -1, begin = 0, end = 0, len = 0;
  if (token < p.num_seqs && holds(token, begin, end, len)) seq = token;
  if (seq < 0 && p.num_seqs > 0) {
    int lo = 0, hi = p.num_seqs;
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (cu[mid] <= token) lo = mid; else hi = mid;
    }
    if (holds(lo, begin, end, len)) seq = lo;
  }
  *seq_out = seq;
  if (seq < 0) return -1;
  return static_cast<int64_t>(len) - (end - begin) + (token - begin);
}

// The rotary position of a token at slot position `pos` (-1: a token of no
// sequence, which stays -1): the table's explicit position when it has them
// (tree verify: the token's depth in the tree), else pos itself.
__device__ __forceinline__ int64_t rotary_position(const RopeTable& t, int token, int64_t pos) {
  if (pos < 0 || t.positions == nullptr) return pos;
  return t.positions64 ? static_cast<const int64_t*>(t.positions)[token]
                       : static_cast<const int32_t*>(t.positions)[token];
}

// Where a token goes in the cache: a position outside what the block table
// holds, or on a page id outside the pool, gets page = -1 (skipped; the Python
// validate_metadata helper reports such entries).
__device__ __forceinline__ TokenPlace place_of_token(const PagedKVParams& p, int token) {
  int seq;
  TokenPlace r{token_position(p, token, &seq), -1, 0};
  if (seq < 0 || r.pos < 0 || r.pos >= static_cast<int64_t>(p.max_pages) * p.page_size) return r;
  r.page = page_of(p, seq, static_cast<int>(r.pos / p.page_size));
  r.slot = static_cast<int>(r.pos % p.page_size);
  return r;
}

// ---------------------------------------------------------------------------
// A lane's part of a row, as pairs of adjacent elements (element 2k + e of
// the lane's kElems is component e of pair k). For the 16-bit types a pair is
// one b32 register of two T: what a 16-byte load gives and a store takes, and
// what one cvt.rn.{bf16,f16}x2.f32 rounds two floats into. The stages take and
// leave pairs and unpack to fp32 only for their math. Rows kept as floats
// (rounded to T and widened again after every step, converted once more for
// the store) cost about a quarter more instructions (4096 tokens of Qwen3-4B
// heads: 14.5M instead of 11.2M warp instructions for the queries kernel) and
// 15-20% more time on the H200, for the same bits. fp32 rows: float2. The pair
// type and its operations: ElemPair (common.cuh).
// One 16-byte vector of a row as pairs, moved as one 16-byte access (a copy
// of the struct itself compiles to four 4-byte ones).
template <typename T>
struct alignas(16) PairVec {
  Pair<T> p[16 / sizeof(Pair<T>)];

  __device__ static __forceinline__ PairVec load(const T* src) {
    const uint4 u = *reinterpret_cast<const uint4*>(src);
    PairVec v;
    memcpy(&v, &u, 16);
    return v;
  }
  __device__ __forceinline__ void store(T* dst) const {
    uint4 u;
    memcpy(&u, this, 16);
    *reinterpret_cast<uint4*>(dst) = u;
  }
};

template <typename T, int D>
__device__ __forceinline__ void load_row(Pair<T> (&x)[RowLayout<T, D>::kPairs], const T* row, int lane) {
  using L = RowLayout<T, D>;
  constexpr int kN = L::kVec / 2;
#pragma unroll
  for (int i = 0; i < L::kVecs; ++i) {
    PairVec<T> v;
    if (L::active(lane, i)) {
      v = PairVec<T>::load(row + L::col(lane, i));
    } else {
#pragma unroll
      for (int e = 0; e < kN; ++e) v.p[e] = ElemPair<T>::round(0.f, 0.f);
    }
#pragma unroll
    for (int e = 0; e < kN; ++e) x[i * kN + e] = v.p[e];
  }
}

template <typename T, int D>
__device__ __forceinline__ void store_row(T* row, const Pair<T> (&x)[RowLayout<T, D>::kPairs], int lane) {
  using L = RowLayout<T, D>;
  constexpr int kN = L::kVec / 2;
#pragma unroll
  for (int i = 0; i < L::kVecs; ++i) {
    PairVec<T> v;
#pragma unroll
    for (int e = 0; e < kN; ++e) v.p[e] = x[i * kN + e];
    if (L::active(lane, i)) v.store(row + L::col(lane, i));
  }
}

// A lane's elements as floats, and back (exact: they hold values of T).
template <typename T, int D>
__device__ __forceinline__ void unpack_row(float (&f)[RowLayout<T, D>::kElems],
                                           const Pair<T> (&x)[RowLayout<T, D>::kPairs]) {
#pragma unroll
  for (int k = 0; k < RowLayout<T, D>::kPairs; ++k) {
    const float2 v = ElemPair<T>::unpack(x[k]);
    f[2 * k] = v.x;
    f[2 * k + 1] = v.y;
  }
}
template <typename T, int D>
__device__ __forceinline__ void pack_row(Pair<T> (&x)[RowLayout<T, D>::kPairs],
                                         const float (&f)[RowLayout<T, D>::kElems]) {
#pragma unroll
  for (int k = 0; k < RowLayout<T, D>::kPairs; ++k) x[k] = ElemPair<T>::round(f[2 * k], f[2 * k + 1]);
}

template <typename T>
__device__ __forceinline__ float round_to(float x) {
  return to_float(from_float<T>(x));
}

// ---------------------------------------------------------------------------
// Stages. Each takes and leaves a lane's pairs (values of T).

// Qwen3's RMSNorm: sum of squares in fp32 (each lane its elements in order,
// then a butterfly over the group: a fixed order, so the same row gives the
// same bits in every kernel), normalized value rounded to T, then times the
// weight in T (one fp32 product rounded to T, as `weight * h.to(dtype)` in
// eager PyTorch). The weight's lane part is loaded per row (held across a
// group's rows, it cost rows_kernel spills). rsqrtf as PyTorch's CUDA rsqrt.
template <typename T, int D>
__device__ __forceinline__ void rms_norm_stage(Pair<T> (&x)[RowLayout<T, D>::kPairs], const T* weight_row, float eps,
                                               int lane) {
  using L = RowLayout<T, D>;
  using RP = ElemPair<T>;
  Pair<T> weight[L::kPairs];
  load_row<T, D>(weight, weight_row, lane);
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < L::kPairs; ++k) {
    const float2 v = RP::unpack(x[k]);
    ss = fmaf(v.x, v.x, ss);
    ss = fmaf(v.y, v.y, ss);
  }
  ss = warp_sum<L::kLanes>(ss);
  // The mean as a product by 1 / D, as PyTorch's mean reduction takes it
  // (exact for a power-of-two D).
  const float inv = rsqrtf(__fadd_rn(__fmul_rn(ss, 1.f / D), eps));
#pragma unroll
  for (int k = 0; k < L::kPairs; ++k) {
    const float2 v = RP::unpack(x[k]);
    x[k] = RP::mul(weight[k], RP::round(__fmul_rn(v.x, inv), __fmul_rn(v.y, inv)));
  }
}

// A full-width rotation (rotary_dim == D, float4 table rows) in two steps: the
// cos / sin of the lane's columns, then the rotation of a row with them. Vector
// i (columns c < D / 2) and vector i + kVecs / 2 (c + D / 2) are partners, in
// this lane, and share the cos / sin of c. On large steps a group of
// rows_kernel takes the first step once for the heads of a token it holds in
// turn (kQueryRowsPerGroup); holding several heads at once costs occupancy.
template <typename T, int D>
struct LaneCosSin {
  using L = RowLayout<T, D>;
  static constexpr int H = L::kVecs / 2;
  float c[H * L::kVec], s[H * L::kVec];

  __device__ __forceinline__ void load(const float* cs, int lane) {
#pragma unroll
    for (int i = 0; i < H; ++i)
#pragma unroll
      for (int e = 0; e < L::kVec; e += 4) {
        const bool on = L::active(lane, i);  // else zeros: the lane's vectors past the row are zeros too
        const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
        const float4 cv = on ? __ldg(reinterpret_cast<const float4*>(cs + L::col(lane, i) + e)) : zero;
        const float4 sv = on ? __ldg(reinterpret_cast<const float4*>(cs + D / 2 + L::col(lane, i) + e)) : zero;
        const int j = i * L::kVec + e;
        c[j] = cv.x, c[j + 1] = cv.y, c[j + 2] = cv.z, c[j + 3] = cv.w;
        s[j] = sv.x, s[j + 1] = sv.y, s[j + 2] = sv.z, s[j + 3] = sv.w;
      }
  }

  __device__ __forceinline__ void rotate(Pair<T> (&x)[L::kPairs]) const {
    using RP = ElemPair<T>;
    constexpr int kHalf = H * L::kVec / 2;  // pairs of the first half
#pragma unroll
    for (int k = 0; k < kHalf; ++k) {
      const float2 a = RP::unpack(x[k]), b = RP::unpack(x[kHalf + k]);
      const float c0 = c[2 * k], c1 = c[2 * k + 1], s0 = s[2 * k], s1 = s[2 * k + 1];
      x[k] = RP::round(__fsub_rn(__fmul_rn(a.x, c0), __fmul_rn(b.x, s0)),
                       __fsub_rn(__fmul_rn(a.y, c1), __fmul_rn(b.y, s1)));
      x[kHalf + k] = RP::round(__fadd_rn(__fmul_rn(b.x, c0), __fmul_rn(a.x, s0)),
                               __fadd_rn(__fmul_rn(b.y, c1), __fmul_rn(a.y, s1)));
    }
  }
};

// Whether rope_stage can take the two steps of LaneCosSin.
__device__ __forceinline__ bool full_width_rotation(const RopeTable& rt, int d) {
  return rt.vec_ok && rt.rotary_dim == d;
}

// Neox (rotate-half) rotary embedding: channel c < h = rotary_dim / 2 pairs with
// c + h. y_c = x_c cos - x_{c+h} sin, y_{c+h} = x_{c+h} cos + x_c sin, each
// product rounded to fp32 before the sum (as the eager reference computes it:
// __fmul_rn keeps the compiler from fusing them into an fma), rounded once to T.
// Channels past rotary_dim are kept. For a full-width rotation the partner of
// a channel sits in the same lane (RowLayout, LaneCosSin); otherwise it usually
// lives in another lane, and the row goes through shared memory (`row`, D
// floats of this group). cs: the position's row of the table, or null to skip
// the math (the group still takes part in __syncwarp; the choice of path is
// the same for every row of a launch).
template <typename T, int D>
__device__ __forceinline__ void rope_stage(Pair<T> (&xp)[RowLayout<T, D>::kPairs], float* row, const float* cs,
                                           const RopeTable& rt, int lane) {
  using L = RowLayout<T, D>;
  if (full_width_rotation(rt, D)) {
    if (cs == nullptr) return;
    LaneCosSin<T, D> t;
    t.load(cs, lane);
    t.rotate(xp);
    return;
  }
  float x[L::kElems];
  unpack_row<T, D>(x, xp);
#pragma unroll
  for (int i = 0; i < L::kVecs; ++i)
#pragma unroll
    for (int e = 0; e < L::kVec; e += 4) {
      const int j = i * L::kVec + e;
      if (L::active(lane, i))
        *reinterpret_cast<float4*>(row + L::col(lane, i) + e) = make_float4(x[j], x[j + 1], x[j + 2], x[j + 3]);
    }
  __syncwarp();
  if (cs != nullptr) {
    const int half = rt.rotary_dim / 2;
#pragma unroll
    for (int i = 0; i < L::kVecs; ++i) {
      const int c0 = L::col(lane, i);
      if (!L::active(lane, i) || c0 >= rt.rotary_dim) continue;
      float cosv[L::kVec], sinv[L::kVec], other[L::kVec];
      if (rt.vec_ok) {
        // The vector lies wholly in one half: cos/sin/partner are 16-byte runs.
        const bool first = c0 < half;
        const int base = first ? c0 : c0 - half;  // index into the cos half
        const int part = first ? c0 + half : c0 - half;
#pragma unroll
        for (int e = 0; e < L::kVec; e += 4) {
          const float4 c = __ldg(reinterpret_cast<const float4*>(cs + base + e));
          const float4 s = __ldg(reinterpret_cast<const float4*>(cs + half + base + e));
          const float4 o = *reinterpret_cast<const float4*>(row + part + e);
          cosv[e] = c.x, cosv[e + 1] = c.y, cosv[e + 2] = c.z, cosv[e + 3] = c.w;
          sinv[e] = s.x, sinv[e + 1] = s.y, sinv[e + 2] = s.z, sinv[e + 3] = s.w;
          other[e] = o.x, other[e + 1] = o.y, other[e + 2] = o.z, other[e + 3] = o.w;
        }
#pragma unroll
        for (int e = 0; e < L::kVec; ++e) {
          float& v = x[i * L::kVec + e];
          v = first ? round_to<T>(__fsub_rn(__fmul_rn(v, cosv[e]), __fmul_rn(other[e], sinv[e])))
                    : round_to<T>(__fadd_rn(__fmul_rn(v, cosv[e]), __fmul_rn(other[e], sinv[e])));
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
  pack_row<T, D>(xp, x);
}

// Quantization of a row for a quantized cache (CacheT: quant.cuh): keys
// divided by their smoothing factors first (smooth: the head's [head_dim] row,
// or null). Per vector (`fixed` null): scale = amax / kMax rounded up to
// QuantFormat's kScaleBits significant bits (1 for an all-zero vector); per
// tensor: scale = *fixed, the caller's. Each element is x / scale
// encoded with saturation (int8: rounded half-even, clamped to +-127; e4m3:
// rounded to nearest even, saturating to +-448). Every division is IEEE
// (__fdiv_rn), as the reference's. Stores when `dst` is not null; returns the scale.
template <typename T, int D, typename CacheT>
__device__ __forceinline__ float quantize_stage(const Pair<T> (&xp)[RowLayout<T, D>::kPairs], const float* smooth,
                                                const float* fixed, uint8_t* dst, int lane) {
  using L = RowLayout<T, D>;
  using Q = QuantFormat<CacheT>;
  float x[L::kElems];
  unpack_row<T, D>(x, xp);
  float src[L::kElems];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < L::kVecs; ++i)
#pragma unroll
    for (int e = 0; e < L::kVec; ++e) {
      const int j = i * L::kVec + e;
      src[j] = smooth != nullptr && L::active(lane, i) ? __fdiv_rn(x[j], __ldg(smooth + L::col(lane, i) + e)) : x[j];
      amax = fmaxf(amax, fabsf(src[j]));
    }
  float scale;
  if (fixed != nullptr) {
    scale = __ldg(fixed);
  } else {
    amax = warp_max<L::kLanes>(amax);
    scale = amax > 0.f ? round_scale_up<CacheT>(__fdiv_rn(amax, Q::kMax)) : 1.f;  // (quant.cuh)
  }
  if (dst != nullptr) {
#pragma unroll
    for (int i = 0; i < L::kVecs; ++i) {
      // kVec elements of one byte: 8 bytes (16-bit T) or 4 bytes (fp32), one store.
      union {
        uint8_t b[L::kVec];
        typename std::conditional<L::kVec == 8, uint2, uint32_t>::type w;
      } pack;
#pragma unroll
      for (int e = 0; e < L::kVec; ++e) pack.b[e] = Q::encode(__fdiv_rn(src[i * L::kVec + e], scale));
      if (L::active(lane, i)) *reinterpret_cast<decltype(pack.w)*>(dst + L::col(lane, i)) = pack.w;
    }
  }
  return scale;
}

// ---------------------------------------------------------------------------
// Kernels.

// Rows of a token tensor a group of rows_kernel takes in turn, on large
// steps: consecutive rows, so mostly heads of one token, whose position and
// cos / sin the group looks up once instead of once per row. It holds one row
// at a time. Small steps keep one row per group: in turn, 4 rows made every
// row's load a dependent step (a 1-token attention_inputs took 3.2 us instead
// of 2.3 on the H200). Large: the grid still has a block per SM. (Rows loaded
// all at once before any math, 2 or 4 per group, are slower; loading the next
// row before this one's math makes no difference; 2 rows per group are slower
// and 8 no faster than 4.)
constexpr int kQueryRowsPerGroup = 4;
inline int rows_per_group_for(int64_t rows, int groups_per_block, int num_sms) {
  return rows >= static_cast<int64_t>(groups_per_block) * kQueryRowsPerGroup * num_sms ? kQueryRowsPerGroup : 1;
}

// Registers of rows_kernel: at most 64 (four blocks per SM, the fastest; it
// takes 72 uncapped, three blocks) for 16-bit rows of up to 128 elements; no cap
// otherwise (fp32 and d 256 rows would spill).
template <typename T, int D>
constexpr int kRowsMinBlocks = sizeof(T) == 2 && D <= 128 ? 4 : 1;

// Rows of a token tensor: optional RMSNorm, optional rotation, store. Grid:
// ceil(num_tokens * num_heads / (kGroups * rows_per_group)) blocks of
// kInputsThreads; a group takes rows_per_group consecutive rows one after the
// other. A row is written unless its rotation has no valid position (explicit
// position outside the table; with kMetadata also a token of no sequence).
template <typename T, int D, bool NORM, PosFrom POS>
__global__ void __launch_bounds__(kInputsThreads, kRowsMinBlocks<T, D>) rows_kernel(const RowsParams p) {
  // Programmatic launches (common.cuh). The next kernel may start only once
  // this one's predecessors are done: kv_write_kernel relies on it.
  wait_for_prior_grids();
  allow_dependent_launch();
  using L = RowLayout<T, D>;
  constexpr bool kRope = POS != PosFrom::kNone;
  const int group = threadIdx.x / L::kLanes;
  const int lane = threadIdx.x % L::kLanes;
  __shared__ __align__(16) float rows[kRope ? L::kGroups : 1][kRope ? D : 4];

  auto position = [&](int token) -> int64_t {
    if constexpr (POS == PosFrom::kInt32) {
      return static_cast<const int32_t*>(p.positions)[token];
    } else if constexpr (POS == PosFrom::kInt64) {
      return static_cast<const int64_t*>(p.positions)[token];
    } else if constexpr (POS == PosFrom::kMetadata) {
      int seq;
      return rotary_position(p.rope, token, token_position(p.kv, token, &seq));  // -1 for no sequence
    }
    return 0;
  };

  // The rows, with the rotation's path fixed at compile time (lane_rotation:
  // LaneCosSin, held per token; else rope_stage, through shared memory): the
  // two paths' registers are not live at once. Every group takes the same
  // number of rows (the stages' shuffles and __syncwarp need the whole warp).
  auto walk = [&](auto lane_rotation) {
    constexpr bool kLaneRotation = decltype(lane_rotation)::value;
    const int64_t first = (static_cast<int64_t>(blockIdx.x) * L::kGroups + group) * p.rows_per_group;
    int token = static_cast<int>(first / p.num_heads);
    int head = static_cast<int>(first % p.num_heads);
    int pos_token = -1;  // the token whose position (and cos / sin) are held
    int64_t pos = 0;
    LaneCosSin<T, D> cs;
#pragma unroll 1
    for (int r = 0; r < p.rows_per_group; ++r) {
      if (r > 0 && ++head == p.num_heads) head = 0, ++token;
      const bool in_range = token < p.num_tokens;
      // The row first: its loads do not wait for the metadata.
      Pair<T> x[L::kPairs];
      if (in_range) {
        load_row<T, D>(x, static_cast<const T*>(p.x) + token * p.x_stride_token + head * p.x_stride_head, lane);
      } else {
#pragma unroll
        for (int i = 0; i < L::kPairs; ++i) x[i] = ElemPair<T>::round(0.f, 0.f);
      }
      if (kRope && in_range && token != pos_token) {
        pos = position(token);
        pos_token = token;
        if (kLaneRotation && pos >= 0 && pos < p.rope.max_position) {
          cs.load(p.rope.cos_sin + pos * p.rope.stride, lane);
        }
      }
      const bool write = in_range && (!kRope || (pos >= 0 && pos < p.rope.max_position));
      if constexpr (NORM) rms_norm_stage<T, D>(x, static_cast<const T*>(p.weight), p.eps, lane);
      if constexpr (kLaneRotation) {
        if (write) cs.rotate(x);
      } else if constexpr (kRope) {
        rope_stage<T, D>(x, rows[group], write ? p.rope.cos_sin + pos * p.rope.stride : nullptr, p.rope, lane);
      }
      if (write) {
        store_row<T, D>(static_cast<T*>(p.out) + token * p.out_stride_token + head * p.out_stride_head, x, lane);
      }
    }
  };
  if (kRope && full_width_rotation(p.rope, D)) {
    walk(std::true_type{});
  } else {
    walk(std::false_type{});
  }
}

// Keys and values of one (token, kv_head) per row into their cache slot:
// optional key RMSNorm and rotation (attention_inputs), then a plain store of
// both (CacheT = T) or a quantized one (CacheT int8_t or __nv_fp8_e4m3: quant.cuh;
// per-vector scales are written beside them, a per-tensor scale only read). Nothing is written for a token of no sequence, a position
// outside the block table or on a page id outside the pool, and (ROPE) a
// position outside the cos/sin table. Grid: ceil(num_tokens * num_kv_heads /
// kGroups) blocks of kInputsThreads, a row per group.
//
// Behind attention_inputs' queries kernel (p.after_queries) it does not wait
// for that kernel at its start: the two read the same inputs and write
// disjoint outputs, and rows_kernel lets it start only after its own wait, so
// every earlier kernel is done by then. The keys and values then overlap the
// queries' last wave. It waits at its end instead, so that its completion
// still implies the queries' (what the attention kernel that waits on it needs).
template <typename T, int D, bool NORM, bool ROPE, typename CacheT>
__global__ void __launch_bounds__(kInputsThreads) kv_write_kernel(const KVWriteParams p) {
  if (!p.after_queries) wait_for_prior_grids();  // programmatic launches (common.cuh)
  allow_dependent_launch();
  using L = RowLayout<T, D>;
  const int group = threadIdx.x / L::kLanes;
  const int lane = threadIdx.x % L::kLanes;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * L::kGroups + group;
  const bool in_range = row < static_cast<int64_t>(p.num_tokens) * p.kv.num_kv_heads;
  const int token = in_range ? static_cast<int>(row / p.kv.num_kv_heads) : 0;
  const int head = in_range ? static_cast<int>(row % p.kv.num_kv_heads) : 0;

  Pair<T> k[L::kPairs], v[L::kPairs];
  if (in_range) {
    load_row<T, D>(k, static_cast<const T*>(p.k) + token * p.k_stride_token + head * p.k_stride_head, lane);
    load_row<T, D>(v, static_cast<const T*>(p.v) + token * p.v_stride_token + head * p.v_stride_head, lane);
  } else {
#pragma unroll
    for (int i = 0; i < L::kPairs; ++i) k[i] = v[i] = ElemPair<T>::round(0.f, 0.f);
  }
  const TokenPlace place = in_range ? place_of_token(p.kv, token) : TokenPlace{-1, -1, 0};

  __shared__ __align__(16) float rows[ROPE ? L::kGroups : 1][ROPE ? D : 4];
  bool write = place.page >= 0;
  // The rotation's position: the slot's, or the explicit one (attention_inputs' positions).
  const int64_t rot_pos = ROPE ? rotary_position(p.rope, token, place.pos) : place.pos;
  if constexpr (ROPE) write = write && rot_pos >= 0 && rot_pos < p.rope.max_position;
  if constexpr (NORM) rms_norm_stage<T, D>(k, static_cast<const T*>(p.k_weight), p.eps, lane);
  if constexpr (ROPE) {
    const float* cs = write ? p.rope.cos_sin + rot_pos * p.rope.stride : nullptr;
    rope_stage<T, D>(k, rows[group], cs, p.rope, lane);
  }
  const int64_t at = write ? scale_offset(p.kv, place.page, head, place.slot) : 0;  // vector index
  if constexpr (kQuantized<CacheT>) {
    const float* smooth = p.k_smooth != nullptr ? p.k_smooth + static_cast<int64_t>(head) * D : nullptr;
    uint8_t* kd = write ? static_cast<uint8_t*>(p.k_pool) + at * D : nullptr;
    uint8_t* vd = write ? static_cast<uint8_t*>(p.v_pool) + at * D : nullptr;
    const bool per_tensor = p.kv.scale_per_tensor;
    const float ks = quantize_stage<T, D, CacheT>(k, smooth, per_tensor ? p.k_scale : nullptr, kd, lane);
    const float vs = quantize_stage<T, D, CacheT>(v, nullptr, per_tensor ? p.v_scale : nullptr, vd, lane);
    if (write && lane == 0 && !per_tensor) {
      p.k_scale[at] = ks;
      p.v_scale[at] = vs;
    }
  } else if (write) {
    store_row<T, D>(static_cast<T*>(p.k_pool) + at * D, k, lane);
    store_row<T, D>(static_cast<T*>(p.v_pool) + at * D, v, lane);
  }
  if (p.after_queries) wait_for_prior_grids();
}

}  // namespace tileinfer
