// Exact int8 -> bf16 / fp16 conversion for the int8 KV cache (SPEC section 6).
// Every int8 value (|x| <= 128) is exact in both types, so the tensor cores see
// the stored integers unchanged; the per-vector scales are applied to scores and
// probabilities instead (attention_kernel.cuh).
//
// Both conversions avoid the slow integer-to-float unit (I2F, a quarter of the
// FP32 rate) with the "magic number" trick: the byte, biased to unsigned
// (x ^ 0x80 = x + 128), is placed into the low mantissa bits of a float whose
// exponent makes one mantissa step equal 1, and the bias is subtracted.
//   fp16: 0x6400 | u is 1024 + u exactly (10 mantissa bits); subtract 1152.
//   bf16: its 7 mantissa bits cannot hold a byte, so go through fp32:
//         0x4B000000 | u is 2^23 + u; subtract 2^23 + 128, and the fp32 result
//         (an integer of at most 8 significant bits) truncates exactly to bf16.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace tileinfer {

// Four int8 (one 32-bit word, byte 0 first) -> four T in two b32 registers,
// element order kept (lo holds bytes 0, 1; hi holds bytes 2, 3).
template <typename T>
__device__ __forceinline__ void int8x4_to(uint32_t w, uint32_t& lo, uint32_t& hi);

template <>
__device__ __forceinline__ void int8x4_to<__half>(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t u = w ^ 0x80808080u;
  const uint32_t h01 = __byte_perm(u, 0x64646464u, 0x5140);  // [0x64, u1, 0x64, u0]
  const uint32_t h23 = __byte_perm(u, 0x64646464u, 0x7362);  // [0x64, u3, 0x64, u2]
  const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));  // 1152
  __half2 a = __hsub2(*reinterpret_cast<const __half2*>(&h01), bias);
  __half2 b = __hsub2(*reinterpret_cast<const __half2*>(&h23), bias);
  lo = *reinterpret_cast<uint32_t*>(&a);
  hi = *reinterpret_cast<uint32_t*>(&b);
}

template <>
__device__ __forceinline__ void int8x4_to<__nv_bfloat16>(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t u = w ^ 0x80808080u;
  constexpr float kBias = 8388736.f;  // 2^23 + 128
  const float f0 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7650)) - kBias;
  const float f1 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7651)) - kBias;
  const float f2 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7652)) - kBias;
  const float f3 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7653)) - kBias;
  lo = __byte_perm(__float_as_uint(f0), __float_as_uint(f1), 0x7632);  // high halves: exact bf16
  hi = __byte_perm(__float_as_uint(f2), __float_as_uint(f3), 0x7632);
}

// Sixteen int8 -> sixteen T (two 16-byte vectors, elements 0-7 and 8-15).
template <typename T>
__device__ __forceinline__ void int8x16_to(const uint4& in, uint4& out0, uint4& out1) {
  int8x4_to<T>(in.x, out0.x, out0.y);
  int8x4_to<T>(in.y, out0.z, out0.w);
  int8x4_to<T>(in.z, out1.x, out1.y);
  int8x4_to<T>(in.w, out1.z, out1.w);
}

}  // namespace tileinfer
