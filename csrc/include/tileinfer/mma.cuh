// Tensor-core and async-copy primitives (sm_80+ PTX, used on Hopper as well):
// 16- and 4-byte cp.async with zero fill, ldmatrix (plain and transposed),
// mma.sync m16n8k16 for bf16 / fp16 inputs with fp32 accumulators and m16n8k32
// for int8 inputs with int32 accumulators.
//
// Fragment layouts of mma.m16n8k16 (lane = threadIdx.x % 32, g = lane / 4,
// c = lane % 4), which the attention kernels rely on:
//   A 16x16 (row-major), 4 x b32: a0 (g, 2c..2c+1), a1 (g+8, 2c..), a2 (g, 8+2c..), a3 (g+8, 8+2c..)
//   B 16x8  (k x n),     2 x b32: b0 (k = 2c..2c+1, n = g), b1 (k = 8+2c.., n = g)
//   C 16x8  fp32,        4 x f32: c0,c1 (g, 2c..2c+1), c2,c3 (g+8, 2c..2c+1)
// So the accumulator of S = Q K^T over two adjacent 8-key blocks is, register for
// register, the A fragment of P for the P V product (FlashAttention-2's trick).
#pragma once

#include <cstdint>
#include <type_traits>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common.cuh"  // pack2

namespace tileinfer {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses L1 (.cg: K/V are streamed once per
// block). When `valid` is false nothing is read and the 16 bytes are zeroed, so
// skipped keys hold finite zeros (a zero value times a zero probability stays 0,
// while stale pool memory could hold NaN).
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem_dst)),
               "l"(gmem_src), "r"(src_bytes)
               : "memory");
}

// 4-byte variant (per-key scales of the int8 cache); .ca: the only caching
// mode cp.async allows below 16 bytes.
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem_dst)), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i
// (shared-space byte addresses: 32-bit, cheaper to keep than generic pointers).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_row));
}

// Same, each matrix transposed on the way (V, whose rows are keys, as the k x n
// operand of P V).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_row));
}

// D += A B for one 16x8x16 tile. The accumulator is passed element by element so
// callers can keep it in whatever array shape suits them (rows x columns).
template <typename T>
__device__ __forceinline__ void mma_16816(float& d0, float& d1, float& d2, float& d3, const uint32_t (&a)[4],
                                          uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float& d0, float& d1, float& d2, float& d3,
                                                         const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__half>(float& d0, float& d1, float& d2, float& d3,
                                                  const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D += A B for one 16x8x32 tile of int8 (s8 x s8, exact s32 accumulators).
// Four int8 per b32 register, the lowest k in the low byte:
//   A 16x32, 4 x b32: a0 (g, 4c..4c+3), a1 (g+8, 4c..), a2 (g, 16+4c..), a3 (g+8, 16+4c..)
//   B 32x8 (k x n), 2 x b32: b0 (k = 4c..4c+3, n = g), b1 (k = 16+4c.., n = g)
//   C 16x8 s32: as the fp32 C of m16n8k16.
// ldmatrix (b16) of rows of int8 gives exactly these: lane l receives bytes
// 4c..4c+3 of row g of each 8-row x 16-byte matrix, so the fragments of a
// 16-bit type's 16 columns serve here for 32 int8 columns.
__device__ __forceinline__ void mma_16832_s8(int& d0, int& d1, int& d2, int& d3, const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(d0), "+r"(d1), "+r"(d2), "+r"(d3)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// For every 16-row tile mt of a warp: C += A[mt] (16 x K) x B (K x 16; b[0..1]
// columns 0-7, b[2..3] columns 8-15), where C[2 mt] / C[2 mt + 1] hold rows
// g / g + 8 and columns 16 n + 8 j + 2 (lane % 4) + e at [4 n + 2 j + e]: the
// register layout of the kernels' scores S and outputs O. K = 16 for a 16-bit
// T (fp32 C), 32 for T = int8_t (s32 C).
template <typename T, int kR, int N, int kRowTiles, typename Acc>
__device__ __forceinline__ void mma_row_tiles(Acc (&c)[kR][N], const uint32_t (&a)[kRowTiles][4],
                                              const uint32_t (&b)[4], int n) {
  static_assert(kR == 2 * kRowTiles, "two accumulator rows (g, g + 8) per 16-row tile");
  static_assert(std::is_same_v<Acc, std::conditional_t<std::is_same_v<T, int8_t>, int, float>>,
                "int8 products accumulate in int, the others in float");
#pragma unroll
  for (int mt = 0; mt < kRowTiles; ++mt) {
    Acc* c0 = c[2 * mt];
    Acc* c1 = c[2 * mt + 1];
    if constexpr (std::is_same_v<T, int8_t>) {
      mma_16832_s8(c0[4 * n], c0[4 * n + 1], c1[4 * n], c1[4 * n + 1], a[mt], b[0], b[1]);
      mma_16832_s8(c0[4 * n + 2], c0[4 * n + 3], c1[4 * n + 2], c1[4 * n + 3], a[mt], b[2], b[3]);
    } else {
      mma_16816<T>(c0[4 * n], c0[4 * n + 1], c1[4 * n], c1[4 * n + 1], a[mt], b[0], b[1]);
      mma_16816<T>(c0[4 * n + 2], c0[4 * n + 3], c1[4 * n + 2], c1[4 * n + 3], a[mt], b[2], b[3]);
    }
  }
}

}  // namespace tileinfer
