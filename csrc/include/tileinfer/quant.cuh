// A quantized cache's element type as a kernel template argument: int8
// (int8_t) or float8 e4m3 (__nv_fp8_e4m3), each with fp32 scales. QuantFormat<CacheT>
// holds what differs between them: the largest stored magnitude and the
// significant bits of a per-vector scale (amax / kMax, rounded up:
// scale_rule.h), the saturating encode of the cache writes
// (inputs.cuh), and the exact conversions to fp16 of the attention kernels
// (int8.cuh, fp8.cuh; x16_to_half below). Everything else (scales on scores and probabilities,
// fp16 P V, key smoothing) is shared (attention_kernel.cuh).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "fp8.cuh"
#include "int8.cuh"
#include "scale_rule.h"

namespace tileinfer {

template <typename CacheT>
inline constexpr bool kQuantized = std::is_same_v<CacheT, int8_t> || std::is_same_v<CacheT, __nv_fp8_e4m3>;

template <typename CacheT>
struct QuantFormat;

template <>
struct QuantFormat<int8_t> {
  static constexpr float kMax = 127.f;
  static constexpr int kScaleBits = 4;  // stored values take 7 significant bits
  // The Hopper prefill's largest factor (a scale times its sequence's power
  // of two: sm90/prefill_scale_range.cuh) lies in [2^kTopLog2, 2^(kTopLog2
  // + 1)): below 32, so that the conversion's bias times a factor, 1152 f,
  // stays within fp16's range (x8_to_scaled_half).
  static constexpr int kTopLog2 = 4;
  // x / scale rounded half-even, clamped to +-127.
  __device__ static __forceinline__ uint8_t encode(float x) {
    return static_cast<uint8_t>(static_cast<int8_t>(fminf(127.f, fmaxf(-127.f, rintf(x)))));
  }
  __device__ static __forceinline__ void x4_to_half(uint32_t w, uint32_t& lo, uint32_t& hi) {
    int8x4_to_half(w, lo, hi);
  }
  __device__ static __forceinline__ void key_pairs_to_half(uint32_t lo, uint32_t hi, uint32_t (&b)[4]) {
    int8_key_pairs_to_half(lo, hi, b);
  }
};

template <>
struct QuantFormat<__nv_fp8_e4m3> {
  static constexpr float kMax = 448.f;
  static constexpr int kScaleBits = 7;  // stored values take 4 significant bits
  static constexpr int kTopLog2 = 6;    // factors below 128: 448 f below 57344
  // x / scale rounded to nearest even e4m3, saturating to +-448 (no NaN from a finite x).
  __device__ static __forceinline__ uint8_t encode(float x) {
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
  }
  __device__ static __forceinline__ void x4_to_half(uint32_t w, uint32_t& lo, uint32_t& hi) {
    fp8x4_to_half(w, lo, hi);
  }
  __device__ static __forceinline__ void key_pairs_to_half(uint32_t lo, uint32_t hi, uint32_t (&b)[4]) {
    fp8_key_pairs_to_half(lo, hi, b);
  }
};

// A per-vector scale as the cache writes store it (scale_rule.h).
template <typename CacheT>
__device__ __forceinline__ float round_scale_up(float scale) {
  return __uint_as_float(round_scale_bits_up<QuantFormat<CacheT>::kScaleBits>(__float_as_uint(scale)));
}

// What the quantized kernels multiply probabilities by before rounding them
// to fp16 for the P V product (the output factor takes it back): 2^15 keeps
// probabilities down to 2^-29 of the row's largest out of fp16's subnormals,
// and the largest (1) within its range.
constexpr int kLog2ProbHeadroom = 15;
constexpr float kProbHeadroom = static_cast<float>(1 << kLog2ProbHeadroom);

// The power of two 2^e that puts a query row's largest |q * k_smooth|
// (`amax`) in [2^13, 2^14), where the kernels round the row to 15-bit
// integers (int8) or fp16 (fp8); 1 for a row of zeros or with a non-finite
// value (amax = inf). The exponent is capped so that tiny (even subnormal)
// rows get a finite scale.
__device__ __forceinline__ float query_row_scale(float amax) {
  if (!(amax > 0.f) || isinf(amax)) return 1.f;
  const int e = ((__float_as_int(amax) >> 23) & 0xff) - 126;  // frexp's exponent (subnormals: -126)
  return __int_as_float((127 + min(14 - e, 126)) << 23);     // 2^(14 - e), a normal float
}

// 1 / x for x = +-2^k with both 2^k and 2^-k normal floats (query_row_scale's
// values, negated or not), exactly: so that a row's factor is a product, not a
// division (the same bits: pre / x rounds pre * 2^-k as pre * (1 / x) does).
__device__ __forceinline__ float pow2_inverse(float x) {
  const uint32_t bits = __float_as_uint(x);
  return __uint_as_float((bits & 0x80000000u) | (0x7f000000u - (bits & 0x7fffffffu)));
}

// Eight stored elements (8 bytes) -> eight fp16 (one 16-byte vector), exactly.
template <typename CacheT>
__device__ __forceinline__ uint4 x8_to_half(const uint2& in) {
  using Q = QuantFormat<CacheT>;
  uint4 out;
  Q::x4_to_half(in.x, out.x, out.y);
  Q::x4_to_half(in.y, out.z, out.w);
  return out;
}

// A row's factor for x8_to_scaled_half: f, and (int8) the conversion's bias
// times f, -1152 f (exact where f has at most 7 significant bits).
struct HalfFactor {
  __half2 f;
  __half2 bias;
  __device__ static __forceinline__ HalfFactor make(float x) {
    const __half2 f = __float2half2_rn(x);
    return {f, __hmul2(f, __float2half2_rn(-1152.f))};
  }
};

// Eight stored elements -> eight fp16 values times f.f, each rounded once:
// exact where the product is an fp16 number (per-vector scales of the
// writes' rule: sm90/prefill_scale_range.cuh). int8 folds the multiply into
// the conversion's subtraction (int8.cuh: h f - 1152 f, one HFMA2 where it
// had one HSUB2), e4m3 multiplies after its exact conversion.
template <typename CacheT>
__device__ __forceinline__ uint4 x8_to_scaled_half(const uint2& in, const HalfFactor& f) {
  uint4 out;
  if constexpr (std::is_same_v<CacheT, int8_t>) {
    int8x4_to_biased_half(in.x, out.x, out.y);
    int8x4_to_biased_half(in.y, out.z, out.w);
    __half2* h = reinterpret_cast<__half2*>(&out);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __hfma2(h[i], f.f, f.bias);
  } else {
    out = x8_to_half<CacheT>(in);
    __half2* h = reinterpret_cast<__half2*>(&out);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __hmul2(h[i], f.f);
  }
  return out;
}

// Sixteen stored elements (one 16-byte vector) -> sixteen fp16 (two 16-byte
// vectors, elements 0-7 and 8-15), exactly.
template <typename CacheT>
__device__ __forceinline__ void x16_to_half(const uint4& in, uint4& out0, uint4& out1) {
  out0 = x8_to_half<CacheT>(make_uint2(in.x, in.y));
  out1 = x8_to_half<CacheT>(make_uint2(in.z, in.w));
}

}  // namespace tileinfer
