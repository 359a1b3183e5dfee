// The online softmax shared by every attention kernel (prefill, decode, fp32).
//
// Scores are taken in units of scale * log2(e) (the multiplier is folded into
// the exp2 argument), so the softmax runs on exp2 (one MUFU.EX2 per score) and
// the running maximum lives in log2 units.
// Each row keeps (m, l): the running maximum of its visible scores and the sum
// of exp2(score - m) over them. A new tile of scores raises m to the tile's
// maximum if needed, and everything accumulated so far (l and the P V
// accumulator) is multiplied by exp2(m_old - m_new).
//
// Rows may be spread over several lanes (kWidth consecutive lanes hold parts of
// one row: 4 in the mma.m16n8k16 accumulator layout). The maximum is reduced
// over those lanes at every tile, the sum only once at the end (each lane's
// partial sum is rescaled by the same factors, so they add up correctly).
//
// Masked scores are -inf. A row that has seen no visible score keeps m = -inf;
// exponents are then taken against 0 instead of m, so -inf - (-inf) never
// happens: the row's probabilities are 0, its sum 0, and `finish` turns that
// into out = 0, lse = -inf (the contract: a row that sees nothing gives 0, never NaN).
//
// The per-layer variants that change the softmax live here too:
//   - logits soft-cap (ScoreMap): a score s = scale * q.k becomes
//     cap * tanh(s / cap). The tanh must see the natural-scale score, so with a
//     cap the raw product is multiplied by scale / cap, goes through tanh, and
//     the exp2 multiplier becomes cap * log2(e) instead of scale * log2(e):
//     the fold into the exp2 argument still holds, with another constant.
//   - learned sinks: a per-head logit that joins a row's denominator once
//     and nothing else, as a key of that score and value 0 would. The
//     16-bit kernels join it after the keys (softmax_result_with_sink): their
//     probabilities are rounded to fp16 / bf16 for the P V product, and must
//     stay relative to the keys' maximum; with the sink leading the row, a
//     sink tens above every key put their probabilities among fp16's
//     subnormals. The fp32 kernel starts each row from it (SoftmaxRow::init's
//     `sink`: m = sink, l = 1 in one lane of the row). Either way a row that
//     sees no key gives out = 0 and lse = the sink.
//   - a fixed exponent offset for soft-capped scores (fixed_offset below),
//     where the probabilities have fp32's exponent range.
// The window is a mask (which keys a row sees): attention_work.cuh.
#pragma once

#include <cmath>
#include <type_traits>

#include "common.cuh"

namespace tileinfer {

constexpr float kNegInf = -INFINITY;

// 2^x on the special-function unit; ftz: denormal results flush to 0, which
// only ever drops probabilities below 2^-126 relative to the row maximum.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Running state of one query row (this lane's share of it).
struct SoftmaxRow {
  float m;  // maximum of the scaled scores seen so far (log2 units), -inf if none
  float l;  // sum of exp2(score - m) over this lane's columns

  // sink: the row's sink logit in log2 units (-inf: none); `owner`: whether
  // this lane holds the sink's term of the sum (one lane per row).
  __device__ __forceinline__ void init(float sink = kNegInf, bool owner = true) {
    m = sink;
    l = owner && sink != kNegInf ? 1.f : 0.f;
  }

  // A sink joined after the keys (complete sums; see the top of this file).
  // Returns what the accumulator, built against the keys' maximum (or a
  // fixed offset), must be multiplied by. `bias`: that of the sums
  // (OnlineSoftmax::update).
  __device__ __forceinline__ float join_sink(float sink, float bias = 0.f) {
    if (sink == kNegInf) return 1.f;
    const float m_new = fmaxf(m, sink);
    const float factor = fast_exp2(m - m_new);  // m = -inf: 0
    l = l * factor + fast_exp2(sink - m_new + bias);
    m = m_new;
    return factor;
  }

  // A row whose exponents are taken against a fixed offset (fixed_offset):
  // m holds the offset for good, and the sum starts at 0.
  __device__ __forceinline__ void init_fixed(float offset) {
    m = offset;
    l = 0.f;
  }

  // Exponent offset for the current tile: m, or 0 while nothing is visible.
  __device__ __forceinline__ float offset() const { return m == kNegInf ? 0.f : m; }

  // Takes the row maximum of a new tile (already reduced over the row's lanes),
  // updates m and l, and returns the factor that rescales the accumulator.
  // kSlack > 0: m stays where it is while the tile's maximum exceeds it by at
  // most kSlack (log2 units), so the probabilities reach 2^kSlack and the
  // accumulator is rescaled only when the maximum jumps (or on the row's
  // first visible tile); the sum and the output take the same offset, so
  // the result is the same function, computed against a lower reference.
  template <int kSlack = 0>
  __device__ __forceinline__ float enter_tile(float tile_max) {
    if constexpr (kSlack > 0) {
      const bool move = tile_max > m + static_cast<float>(kSlack);  // m = -inf: any visible score
      const float factor = move ? fast_exp2(m - tile_max) : 1.f;
      m = move ? tile_max : m;
      l *= factor;
      return factor;
    }
    const float m_new = fmaxf(m, tile_max);
    const float factor = fast_exp2(m - (m_new == kNegInf ? 0.f : m_new));  // exp2(-inf) = 0
    m = m_new;
    l *= factor;
    return factor;
  }
};

// Final values of a row: the factor that turns the accumulator into the
// normalized output (0 when the row saw nothing) and the natural-log
// log-sum-exp of the scaled scores (-inf when it saw nothing).
struct SoftmaxResult {
  float inv_sum;
  float lse;
};

__device__ __forceinline__ SoftmaxResult softmax_result(float m, float l) {
  if (!(l > 0.f)) return {0.f, kNegInf};
  return {1.f / l, (m + log2f(l)) * kLn2};
}

// softmax_result of a row whose sink joins it only now, after its keys
// (SoftmaxRow::join_sink; `bias`: that of the sums): inv_sum also carries
// the factor that the accumulator, built without the sink, needs.
__device__ __forceinline__ SoftmaxResult softmax_result_with_sink(SoftmaxRow row, float sink, float bias = 0.f) {
  const float keep = row.join_sink(sink, bias);
  SoftmaxResult res = softmax_result(row.m - bias, row.l);
  res.inv_sum *= keep;
  return res;
}

// Merges partial states of one row over disjoint sets of scores (sums
// complete, i.e. already reduced over lanes): M = max m_i, L = sum l_i 2^(m_i - M).
// A part that saw nothing (m = -inf, l = 0) adds 0. Fixed order: same bits every run.
template <int N>
__device__ __forceinline__ SoftmaxRow merge_rows(const SoftmaxRow (&parts)[N]) {
  SoftmaxRow total;
  total.m = parts[0].m;
#pragma unroll
  for (int i = 1; i < N; ++i) total.m = fmaxf(total.m, parts[i].m);
  const float off = total.offset();
  total.l = 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) total.l += parts[i].l * fast_exp2(parts[i].m - off);
  return total;
}

// kRows rows per lane, each spread over kWidth consecutive lanes.
template <int kRows, int kWidth>
struct OnlineSoftmax {
  SoftmaxRow row[kRows];  // each kernel starts its rows itself (SoftmaxRow::init, with its sink)

  // s[r][c]: this lane's scores of a tile (masked ones -inf); the scaled scores
  // are s * k (k > 0: scale * log2(e), or 1 when the caller scaled already).
  // Folding k into the exp2 argument saves a multiply per score, and
  // max(s) * k == max(s * k) for k > 0. s is replaced by the probabilities
  // exp2(s * k - m); factor[r] is what the caller multiplies its accumulator
  // rows by.
  //
  // The second form takes a multiplier per row (each > 0: a kernel that
  // folds a row's own factor into it) and `bias`, log2 of a power of two
  // that the probabilities, and so l, come out multiplied by (0: none; the
  // quantized Hopper prefill's fp16 headroom, which SoftmaxRow::join_sink
  // and softmax_result then take back).
  //
  // kSlack: SoftmaxRow::enter_tile's (the probabilities reach 2^kSlack times
  // 2^bias: the caller's element type must hold them).
  template <int kSlack = 0, int kCols>
  __device__ __forceinline__ void update(float (&s)[kRows][kCols], float k, float (&factor)[kRows]) {
    float row_k[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) row_k[r] = k;
    update<kSlack>(s, row_k, factor, 0.f);
  }
  template <int kSlack = 0, int kCols>
  __device__ __forceinline__ void update(float (&s)[kRows][kCols], const float (&k)[kRows], float (&factor)[kRows],
                                         float bias) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float mx = s[r][0];
#pragma unroll
      for (int c = 1; c < kCols; ++c) mx = fmaxf(mx, s[r][c]);
      mx = warp_max<kWidth>(mx);
      factor[r] = row[r].template enter_tile<kSlack>(mx * k[r]);  // -inf * k = -inf
      const float neg_off = bias - row[r].offset();
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        s[r][c] = fast_exp2(fmaf(s[r][c], k[r], neg_off));
        sum += s[r][c];
      }
      row[r].l += sum;
    }
  }

  // Scores with a fixed offset (rows started by init_fixed): the
  // probabilities exp2(s * k - m) against each row's m as it is, so no
  // maximum to take and nothing to rescale (fixed_offset).
  template <int kCols>
  __device__ __forceinline__ void update_fixed(float (&s)[kRows][kCols], float k) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float neg_off = -row[r].m;
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        s[r][c] = fast_exp2(fmaf(s[r][c], k, neg_off));
        sum += s[r][c];
      }
      row[r].l += sum;
    }
  }

  // Completes the sums over the row's lanes (every lane gets the full sum).
  __device__ __forceinline__ void reduce_sums() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) row[r].l = warp_sum<kWidth>(row[r].l);
  }
};

// A fixed exponent offset for soft-capped scores. A capped score lies in
// [-k, k] in log2 units (k = cap * log2(e)), so with every exponent taken
// against one offset c, each probability lies in [2^(-k - c), 2^(k - c)]:
// the running maximum, which keeps them at most 1, is only needed where
// that range does not fit the probabilities' type. In fp32 and bf16 (the
// Hopper prefill's P for bf16 inputs) it fits with c = min(k, 120 - k):
//   - every probability at least 2^-120, a normal number (nothing flushes
//     to 0, where the running maximum flushes those below 2^-126 of the
//     row's largest);
//   - at most 1 for caps up to 41.5 (k <= 60), and 2^(2k - 120) beyond:
//     2^24.3 at Gemma 2's cap of 50, and 2^kFixedOffsetHeadroom at most,
//     so the row sums and the P V accumulator stay within fp32 for values
//     below 2^(128 - kFixedOffsetHeadroom - log2(keys)).
// What it saves, per score: the maximum (and its reduction over the row's
// lanes), and per tile the rescale of the accumulator (one multiply per
// element: as many as the scores again at head dim 128). The tanh already
// costs the capped softmax two instructions per score (ScoreMap).
constexpr float kFixedOffsetFloor = 120.f;
constexpr float kFixedOffsetHeadroom = 32.f;

__host__ __device__ constexpr bool fixed_offset_fits(float soft_cap) {
  return soft_cap > 0.f && 2.f * soft_cap * kLog2e - kFixedOffsetFloor <= kFixedOffsetHeadroom;
}
__host__ __device__ constexpr float fixed_offset(float soft_cap) {
  const float k = soft_cap * kLog2e;
  return k < kFixedOffsetFloor - k ? k : kFixedOffsetFloor - k;
}

// The largest cap at which outputs of type T take tanh.approx.f32: its
// relative error, 2^-11, puts up to cap * 2^-11 on a capped score, and about
// as much, relatively, on the score's probability. Measured on the Hopper
// prefill with scores three times the cap: fp16 outputs 17.7 ulps from
// float64 at a cap of 60, about 0.3 ulps per unit of cap, where bf16's ulp
// is 8 times fp16's. Up to these caps the outputs stay within ~2.5 ulps of
// the exact tanh's; beyond them the exact form serves.
template <typename T>
constexpr float kFastTanhMaxCap = std::is_same_v<T, __nv_bfloat16> ? 64.f : 8.f;
static_assert((kFixedOffsetFloor + kFixedOffsetHeadroom) / (2.f * kLog2e) <= kFastTanhMaxCap<__nv_bfloat16>,
              "a fixed offset (bf16) always takes the one-instruction tanh");

// How raw products x = q . k become what OnlineSoftmax::update takes (its
// scores s and multiplier k: the softmax runs on exp2(s * k - m)).
//   no cap, scale > 0:  s = x,                        k = scale * log2(e)  (folded)
//   no cap, scale <= 0: s = x * scale * log2(e),      k = 1
//   cap > 0:            s = tanh(x * scale / cap),    k = cap * log2(e)
// so that s * k is the (capped) score in log2 units. Applied before masking
// (masked scores become -inf afterwards), after the int8 key scales (the tanh
// needs the true product). Runtime branches only: a kernel without a cap pays
// one uniform test per tile.
// Two forms of the tanh: tanh_exp2 (exact to ~2^-22, two MUFU operations per
// score) by default, and tanh.approx.f32 (one MUFU, relative error 2^-11) for
// the Hopper prefill kernel (kFastTanh) up to the caps where its error stays
// within the output's bounds (`fast`: kFastTanhMaxCap), where each
// instruction of the softmax lengthens a warpgroup's path between its
// products: one instruction per score against ex2, rcp and the arithmetic
// around them. On the H200 (1 x 8k causal, cap 50) the capped prefill with
// the running maximum took 1.12-1.20x the plain one's time with it, 1.37x
// with tanh_exp2 (docs/PERFORMANCE.md).
struct ScoreMap {
  float pre;  // what x is multiplied by first (scale / cap, or scale * log2(e) when not folded)
  float k;    // update's multiplier
  bool cap;   // soft-cap: tanh(x * pre)
  bool mul;   // no cap and an unfoldable scale: x * pre
  bool fast;  // cap: the one-instruction tanh is accurate enough (for kFastTanh callers)

  // fast_cap: the largest cap at which the caller's outputs take the
  // one-instruction tanh (kFastTanhMaxCap of its output type).
  __device__ __forceinline__ static ScoreMap make(float scale, float soft_cap, float fast_cap = 0.f) {
    if (soft_cap > 0.f) return {scale / soft_cap, soft_cap * kLog2e, true, false, soft_cap <= fast_cap};
    const float scale_log2 = scale * kLog2e;
    // Folding needs k > 0: max(x) * k == max(x * k) only then.
    if (scale_log2 > 0.f) return {1.f, scale_log2, false, false, false};
    return {scale_log2, 1.f, false, true, false};
  }

  template <bool kFastTanh = false, int kRows, int kCols>
  __device__ __forceinline__ void apply(float (&s)[kRows][kCols]) const {
    if (cap) {
      if (kFastTanh && fast) {
        apply_cap<true>(s);
      } else {
        apply_cap<false>(s);
      }
    } else if (mul) {
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int c = 0; c < kCols; ++c) s[r][c] *= pre;
    }
  }

  // apply() of a map known to cap (a kernel built for capped scores), with
  // the tanh it names.
  template <bool kFastTanh = false, int kRows, int kCols>
  __device__ __forceinline__ void apply_cap(float (&s)[kRows][kCols]) const {
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int c = 0; c < kCols; ++c) s[r][c] = kFastTanh ? tanh_approx(s[r][c] * pre) : tanh_exp2(s[r][c] * pre);
  }

  // What apply() multiplies by, for callers that fold it into a factor of
  // their own (the int8 kernels' per-row 2^-e), and apply() for their scores.
  __device__ __forceinline__ float pre_factor() const { return cap || mul ? pre : 1.f; }
  template <bool kFastTanh = false, int kRows, int kCols>
  __device__ __forceinline__ void apply_premultiplied(float (&s)[kRows][kCols]) const {
    if (cap) {
      if (kFastTanh && fast) {
        tanh_all<true>(s);
      } else {
        tanh_all<false>(s);
      }
    }
  }
  template <bool kFastTanh, int kRows, int kCols>
  __device__ __forceinline__ static void tanh_all(float (&s)[kRows][kCols]) {
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int c = 0; c < kCols; ++c) s[r][c] = kFastTanh ? tanh_approx(s[r][c]) : tanh_exp2(s[r][c]);
  }

  // One product's score in log2 units, k included, with the tanh of the math
  // library: the fp32 kernel, whose 1e-5 bound the exp2 form would not meet at
  // large caps (its error, ~2^-22 absolute on the tanh, grows with the cap).
  __device__ __forceinline__ float log2_score_precise(float x) const {
    if (cap) return k * tanhf(x * pre);
    return mul ? x * pre : x * k;
  }

  // tanh(y) = 1 - 2 / (1 + e), e = 2^(2 y log2(e)): one MUFU.EX2 and one
  // MUFU.RCP (both about 2^-22 relative), so an absolute error of about 2^-22
  // for every y (e = inf or 0 gives +-1 exactly), and the capped score is off
  // by about cap * 2^-22. tanh.approx.f32 costs one MUFU but its 2^-11
  // relative error puts up to cap * 2^-11 on a score: 0.024 at Gemma 2's cap
  // of 50, a 2.4% error on that key's probability, several fp16 ulps. This
  // form takes as many registers as tanh.approx (each value in place); the
  // form with |y| and copysign took up to 38 more in the unrolled tiles.
  __device__ __forceinline__ static float tanh_approx(float y) {
    float r;
    asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(y));
    return r;
  }
  __device__ __forceinline__ static float tanh_exp2(float y) {
    const float e = fast_exp2(y * (2.f * kLog2e));
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.f + e));
    return fmaf(-2.f, r, 1.f);
  }
};

}  // namespace tileinfer
