// Warpgroup MMA (wgmma, sm_90a): shared-memory descriptors, the fences and
// waits around asynchronous products, and m64nNk16 with fp32 accumulators for
// bf16 / fp16, for the Hopper prefill kernel (sm90/prefill_kernel.cuh).
//
// Shared-memory layout of every operand tile: the 128-byte-swizzle layout. A
// tile of R rows x D elements is D / 64 blocks, one per 64 columns; a block is
// R rows of 128 bytes, and 16-byte chunk c of row r sits at chunk position
// c ^ (r % 8). Each 8-row group is one 1024-byte swizzle atom: the hardware
// XORs address bits [7, 10) into bits [4, 7), so every block starts 1024-byte
// aligned. The bulk tensor copy engine writes exactly this layout with
// CU_TENSOR_MAP_SWIZZLE_128B and a 64-element inner box.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../common.cuh"

// The wgmma instructions exist only on the sm_90a target.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TILEINFER_WGMMA_ENABLED 1
#else
#define TILEINFER_WGMMA_ENABLED 0
#endif

namespace tileinfer {
namespace wgmma {

// Shared-memory matrix descriptor: start address >> 4 (bits 0-13), leading
// dimension byte offset >> 4 (16-29), stride dimension byte offset >> 4
// (32-45), base offset 0 (49-51: atoms are 1024-byte aligned), swizzle mode
// 128B = 1 (bits 62-63).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t smem_byte_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return static_cast<uint64_t>((smem_byte_addr >> 4) & 0x3FFFu) |
         (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32) | (uint64_t(1) << 62);
}

// A descriptor moved by `bytes` (a multiple of 16): one 32-bit add to its
// start address field, which takes the whole sum (shared-memory addresses
// stay below 2^18, so it never carries into the leading offset). The
// products' k-steps are issued inside a consumer's turn at the tensor cores
// (prefill_consumer.cuh); building each step's descriptor there (shift, mask,
// or per operand) lengthened the turn by a third.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

__device__ __forceinline__ void fence() {
#if TILEINFER_WGMMA_ENABLED
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void commit() {
#if TILEINFER_WGMMA_ENABLED
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wait() {
#if TILEINFER_WGMMA_ENABLED
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Makes this thread's generic-proxy shared-memory writes (cp.async, stores)
// visible to later async-proxy reads (wgmma operands); a barrier follows.
__device__ __forceinline__ void fence_proxy_async_smem() {
#if TILEINFER_WGMMA_ENABLED
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Pins registers at this point of the program (an empty asm that "writes"
// them): uses of a wgmma accumulator stay after the wait_group before it.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// wgmma.mma_async m64nNk16 with fp32 accumulators, for element type T. The
// accumulator of a thread (warp w of the warpgroup, lane = 4 g + c):
// d[4 j + 2 r + e] is row 16 w + g + 8 r, column 8 j + 2 c + e.
template <typename T, int N>
struct Mma;

#if TILEINFER_WGMMA_ENABLED
// The specializations, one macro per N for both element types (the PTX
// type name is the only difference): accumulator operands "+f"(d[0..N/2)),
// named %0.. in the instruction text; the inputs follow them.
#define TILEINFER_WGMMA_F8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define TILEINFER_WGMMA_F32 TILEINFER_WGMMA_F8(0), TILEINFER_WGMMA_F8(8), TILEINFER_WGMMA_F8(16), TILEINFER_WGMMA_F8(24)
#define TILEINFER_WGMMA_F64 TILEINFER_WGMMA_F32, TILEINFER_WGMMA_F8(32), TILEINFER_WGMMA_F8(40), \
                            TILEINFER_WGMMA_F8(48), TILEINFER_WGMMA_F8(56)
#define TILEINFER_WGMMA_R32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define TILEINFER_WGMMA_R64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
// ss: D (+)= A B, A and B from shared memory, both K-major; scale_d = 0 ignores
// D's old value. rs_tnsp_b: D += A B, A (4 x b32 per thread) from registers,
// B from shared memory N-major (transposed). SS_IN / RS_IN: the inputs'
// operand names, after the N / 2 accumulators.
#define TILEINFER_WGMMA_MMA(T, TYPE, N, OUTS, REGS, SS_IN, SS_SCALE, RS_IN)                                       \
  template <>                                                                                                    \
  struct Mma<T, N> {                                                                                             \
    __device__ __forceinline__ static void ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) { \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SS_SCALE ", 0;\n"                                        \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " REGS ", " SS_IN          \
                   ", p, 1, 1, 0, 0;\n}\n"                                                                      \
                   : OUTS                                                                                        \
                   : "l"(desc_a), "l"(desc_b), "r"(scale_d));                                                    \
    }                                                                                                            \
    __device__ __forceinline__ static void rs_tnsp_b(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b) { \
      asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " REGS ", " RS_IN           \
                   ", 1, 1, 1, 1;\n"                                                                             \
                   : OUTS                                                                                        \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));                                   \
    }                                                                                                            \
  };
#define TILEINFER_WGMMA_F128 TILEINFER_WGMMA_F64, TILEINFER_WGMMA_F8(64), TILEINFER_WGMMA_F8(72), \
                             TILEINFER_WGMMA_F8(80), TILEINFER_WGMMA_F8(88), TILEINFER_WGMMA_F8(96), \
                             TILEINFER_WGMMA_F8(104), TILEINFER_WGMMA_F8(112), TILEINFER_WGMMA_F8(120)
#define TILEINFER_WGMMA_R128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define TILEINFER_WGMMA_MMA_64(T, TYPE) \
  TILEINFER_WGMMA_MMA(T, TYPE, 64, TILEINFER_WGMMA_F32, TILEINFER_WGMMA_R32, "%32, %33", "%34", "{%32, %33, %34, %35}, %36")
#define TILEINFER_WGMMA_MMA_128(T, TYPE) \
  TILEINFER_WGMMA_MMA(T, TYPE, 128, TILEINFER_WGMMA_F64, TILEINFER_WGMMA_R64, "%64, %65", "%66", "{%64, %65, %66, %67}, %68")
#define TILEINFER_WGMMA_MMA_256(T, TYPE) \
  TILEINFER_WGMMA_MMA(T, TYPE, 256, TILEINFER_WGMMA_F128, TILEINFER_WGMMA_R128, "%128, %129", "%130", \
                      "{%128, %129, %130, %131}, %132")
TILEINFER_WGMMA_MMA_256(__nv_bfloat16, "bf16")
TILEINFER_WGMMA_MMA_256(__half, "f16")
TILEINFER_WGMMA_MMA_64(__nv_bfloat16, "bf16")
TILEINFER_WGMMA_MMA_128(__nv_bfloat16, "bf16")
TILEINFER_WGMMA_MMA_64(__half, "f16")
TILEINFER_WGMMA_MMA_128(__half, "f16")
#undef TILEINFER_WGMMA_MMA_256
#undef TILEINFER_WGMMA_MMA_128
#undef TILEINFER_WGMMA_MMA_64
#undef TILEINFER_WGMMA_MMA
#undef TILEINFER_WGMMA_R128
#undef TILEINFER_WGMMA_R64
#undef TILEINFER_WGMMA_R32
#undef TILEINFER_WGMMA_F128
#undef TILEINFER_WGMMA_F64
#undef TILEINFER_WGMMA_F32
#undef TILEINFER_WGMMA_F8
#else
// Other targets: never called (the launcher checks the device, and the kernel
// traps there); declared so that the templates parse.
template <typename T, int N>
struct Mma {
  __device__ __forceinline__ static void ss(float (&)[N / 2], uint64_t, uint64_t, int) {}
  __device__ __forceinline__ static void rs_tnsp_b(float (&)[N / 2], const uint32_t (&)[4], uint64_t) {}
};
#endif


// ---- Fragments of the attention products (both Hopper prefill kernels) ----

// S = Q K^T of one key tile, issued as one commit group: A = Q (kBlockM-row
// tile, this warpgroup's rows from q_base), B = K (kBlockN rows), both K-major
// in shared memory; k-step kk is block kk / 4, 32 (kk % 4) bytes into the atom.
template <typename T, int kBlockM, int kBlockN, int D>
__device__ __forceinline__ void issue_qk(float (&acc)[kBlockN / 2], uint32_t q_base, uint32_t k_tile) {
  const uint64_t qa = desc_sw128(q_base, 16, 1024);
  const uint64_t kb = desc_sw128(k_tile, 16, 1024);
  fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t koff = (kk & 3) * 32;
    const uint64_t da = desc_advance(qa, (kk >> 2) * kBlockM * 128 + koff);
    const uint64_t db = desc_advance(kb, (kk >> 2) * kBlockN * 128 + koff);
    Mma<T, kBlockN>::ss(acc, da, db, kk > 0 ? 1 : 0);
  }
  commit();
}

// The S accumulator as this thread's two rows of scores, s[R][2 j + e] = row
// R, key 8 j + 2 (lane % 4) + e (the tile kernel's layout, which the softmax
// and the masks take); raw products (ScoreMap, softmax.cuh, maps them).
template <int N>
__device__ __forceinline__ void acc_to_rows(const float (&acc)[N / 2], float (&s)[2][N / 4]) {
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int R = 0; R < 2; ++R)
#pragma unroll
      for (int e = 0; e < 2; ++e) s[R][2 * j + e] = acc[4 * j + 2 * R + e];
}

// P rounded to T as the A fragments of O += P V: keys 16 kk.. are the
// accumulator's n-blocks 2 kk, 2 kk + 1, register for register.
template <typename T, int N>
__device__ __forceinline__ void rows_to_a(const float (&s)[2][N / 4], uint32_t (&a)[N / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    a[kk][0] = pack2<T>(s[0][4 * kk], s[0][4 * kk + 1]);
    a[kk][1] = pack2<T>(s[1][4 * kk], s[1][4 * kk + 1]);
    a[kk][2] = pack2<T>(s[0][4 * kk + 2], s[0][4 * kk + 3]);
    a[kk][3] = pack2<T>(s[1][4 * kk + 2], s[1][4 * kk + 3]);
  }
}

// O += P V of one key tile, issued as one commit group: P rounded to T (the A
// fragments a[kk] of keys 16 kk.., from rows_to_a) from registers, V (kBlockN
// rows) from shared memory N-major. The A registers are read asynchronously
// too: their definitions are pinned before wgmma.fence (PTX: register writes of
// A must precede it) and kept alive until wait_pv (as FlashAttention-3 does for
// its RS products).
template <typename T, int D, int kBlockN>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], uint32_t (&a)[kBlockN / 16][4], uint32_t v_tile) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) fence_regs(a[kk]);
  fence_regs(o);
  const uint64_t vb = desc_sw128(v_tile, kBlockN * 128, 1024);
  fence();
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    const uint64_t db = desc_advance(vb, kk * 16 * 128);
    Mma<T, D>::rs_tnsp_b(o, a[kk], db);
  }
  commit();
}

// Waits for every product issued so far, then keeps O and P where the products
// left them (P's registers are free again after it).
template <int D, int kBlockN>
__device__ __forceinline__ void wait_pv(float (&o)[D / 2], uint32_t (&a)[kBlockN / 16][4]) {
  wait<0>();
  fence_regs(o);
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) fence_regs(a[kk]);
}

// O rows times the softmax's factors (skipped when the warp has none to apply).
template <int D>
__device__ __forceinline__ void rescale_rows(float (&o)[D / 2], const float (&factor)[2]) {
  if (__any_sync(0xffffffffu, factor[0] != 1.f || factor[1] != 1.f)) {
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int R = 0; R < 2; ++R) {
        o[4 * j + 2 * R] *= factor[R];
        o[4 * j + 2 * R + 1] *= factor[R];
      }
  }
}

}  // namespace wgmma
}  // namespace tileinfer
