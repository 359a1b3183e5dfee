// Exact float8 e4m3 -> fp16 conversion for the fp8 KV cache. Every e4m3 value
// (max 448, subnormals down to 2^-9) is an fp16 normal, so, as for int8
// (int8.cuh), the tensor cores see the stored values unchanged and the scales
// go on the scores and probabilities (attention_kernel.cuh).
//
// sm_89 on: one cvt.rn.f16x2.e4m3x2 per two values. Older targets: each byte
// placed atop a 16-bit lane and shifted one bit down puts its sign, exponent
// and mantissa into fp16's fields with an exponent 8 too small (bias 15 instead
// of 7; subnormals land on fp16 subnormals), which a multiply by 2^8 restores.
// Writes of finite values with a positive scale never store NaN (they
// saturate); a NaN that got in (0x7f) would read as 480 here.
#pragma once

#include <cstdint>
#include <cuda_fp16.h>

namespace tileinfer {

// Bytes 0 and 1 of `w` (sel 0x1404) or 2 and 3 (sel 0x3424), e4m3, -> an fp16
// pair (the lower byte in the lower half).
template <uint32_t kSel>
__device__ __forceinline__ uint32_t fp8x2_to_half2(uint32_t w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // The halves of w as 16-bit registers: the conversion reads the upper one
  // in place (R.H1), with no shift.
  uint32_t h;
  if constexpr (kSel == 0x1404u) {
    asm("{.reg .b16 l, u; mov.b32 {l, u}, %1; cvt.rn.f16x2.e4m3x2 %0, l;}" : "=r"(h) : "r"(w));
  } else {
    asm("{.reg .b16 l, u; mov.b32 {l, u}, %1; cvt.rn.f16x2.e4m3x2 %0, u;}" : "=r"(h) : "r"(w));
  }
  return h;
#else
  const uint32_t t = __byte_perm(w, 0u, kSel);                          // [0, b, 0, b']
  const uint32_t bits = (t & 0x80008000u) | ((t >> 1) & 0x3f803f80u);  // sign; exponent, mantissa
  const __half2 s = __halves2half2(__ushort_as_half(0x5c00), __ushort_as_half(0x5c00));  // 2^8
  const __half2 x = __hmul2(*reinterpret_cast<const __half2*>(&bits), s);
  return *reinterpret_cast<const uint32_t*>(&x);
#endif
}

// Four e4m3 (one 32-bit word, byte 0 first) -> four fp16 in two b32 registers,
// element order kept (lo holds bytes 0, 1; hi holds bytes 2, 3).
__device__ __forceinline__ void fp8x4_to_half(uint32_t w, uint32_t& lo, uint32_t& hi) {
  lo = fp8x2_to_half2<0x1404u>(w);
  hi = fp8x2_to_half2<0x3424u>(w);
}

// The P V B fragments of 16 keys x 16 columns of e4m3 values, from a
// transposed ldmatrix of their rows, as int8_key_pairs_to_half (int8.cuh) lays
// them out: bytes 0 and 2 of `lo` / `hi` (column 2g) into b[0] / b[1], bytes 1
// and 3 (column 2g + 1) into b[2] / b[3].
__device__ __forceinline__ void fp8_key_pairs_to_half(uint32_t lo, uint32_t hi, uint32_t (&b)[4]) {
  fp8x4_to_half(__byte_perm(lo, hi, 0x6420), b[0], b[1]);  // [lo 0, lo 2, hi 0, hi 2]
  fp8x4_to_half(__byte_perm(lo, hi, 0x7531), b[2], b[3]);  // [lo 1, lo 3, hi 1, hi 3]
}

}  // namespace tileinfer
