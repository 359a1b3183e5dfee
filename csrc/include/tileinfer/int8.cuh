// Exact int8 -> fp16 conversion for the int8 KV cache. Every
// int8 value is exact in fp16, so the tensor cores see the stored integers
// unchanged; the per-vector scales are applied to scores and probabilities
// instead (attention_kernel.cuh), or, in the Hopper prefill, folded into the
// conversion's subtraction (quant.cuh, x8_to_scaled_half).
//
// The conversion avoids the slow integer-to-float unit (I2F, a quarter of the
// FP32 rate) with the "magic number" trick: the byte, biased to unsigned
// (x ^ 0x80 = x + 128), is placed into the low mantissa bits of 0x6400 (1024,
// where one mantissa step is 1), giving 1024 + x + 128 exactly; subtracting
// 1152 leaves x. Five instructions per 4 values. (bf16's 7 mantissa bits cannot
// hold a byte: the same trick through fp32 took 11, which is why the int8
// kernels compute in fp16 whatever the queries' type.)
#pragma once

#include <cstdint>
#include <cuda_fp16.h>

namespace tileinfer {

// An fp16 pair of biased bytes placed under 0x64 (1024 + x + 128, exactly)
// minus 1152: the pair of int8 values x.
__device__ __forceinline__ uint32_t unbias_half2(uint32_t h) {
  const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));  // 1152
  const __half2 v = __hsub2(*reinterpret_cast<const __half2*>(&h), bias);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Four int8 (one 32-bit word, byte 0 first) -> four biased fp16 (1024 + x +
// 128) in two b32 registers, element order kept (lo holds bytes 0, 1; hi
// holds bytes 2, 3): what unbias_half2 (or a scaled form of it) finishes.
__device__ __forceinline__ void int8x4_to_biased_half(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t u = w ^ 0x80808080u;
  lo = __byte_perm(u, 0x64646464u, 0x5140);  // [0x64, u1, 0x64, u0]
  hi = __byte_perm(u, 0x64646464u, 0x7362);  // [0x64, u3, 0x64, u2]
}

// Four int8 -> four fp16, as above, exactly.
__device__ __forceinline__ void int8x4_to_half(uint32_t w, uint32_t& lo, uint32_t& hi) {
  int8x4_to_biased_half(w, lo, hi);
  lo = unbias_half2(lo);
  hi = unbias_half2(hi);
}

// The P V B fragments of 16 keys x 16 columns of int8 values, from a
// transposed ldmatrix of their rows (8 keys each): `lo` (keys 0-7) and `hi`
// (keys 8-15) hold bytes [key 2c, column 2g], [2c, 2g + 1], [2c + 1, 2g],
// [2c + 1, 2g + 1] of lane (g = lane / 4, c = lane % 4). b[0], b[1]: the keys
// (2c, 2c + 1) and (8 + 2c, 9 + 2c) of column 2g as fp16 pairs (one 8-column
// n-block: the even columns); b[2], b[3]: the same of column 2g + 1.
__device__ __forceinline__ void int8_key_pairs_to_half(uint32_t lo, uint32_t hi, uint32_t (&b)[4]) {
  const uint32_t ul = lo ^ 0x80808080u, uh = hi ^ 0x80808080u;
  const uint32_t w[4] = {__byte_perm(ul, 0x64646464u, 0x4240), __byte_perm(uh, 0x64646464u, 0x4240),
                         __byte_perm(ul, 0x64646464u, 0x4341), __byte_perm(uh, 0x64646464u, 0x4341)};
#pragma unroll
  for (int i = 0; i < 4; ++i) b[i] = unbias_half2(w[i]);
}

}  // namespace tileinfer
