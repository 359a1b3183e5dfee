// Hopper's asynchronous machinery, as used by the warp-specialized prefill
// kernel: shared-memory barriers (mbarrier) with transaction counts, the bulk
// tensor copy engine (TMA) completing on them, named barriers between
// warpgroups, and register reallocation between warpgroups (setmaxnreg).
//
// mbarrier protocol (one per ring stage): a barrier completes a phase when its
// pending arrivals reach zero and the bytes it expects have landed. Waiters
// wait for a phase by its parity. A producer waits on "empty" barriers with
// the inverted parity, so its first pass over a fresh ring does not block.
#pragma once

#include <cstdint>

#include "wgmma.cuh"  // TILEINFER_WGMMA_ENABLED: the sm_90a-only parts

namespace tileinfer {
namespace sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals) {
#if TILEINFER_WGMMA_ENABLED
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
#endif
}
// Makes the barrier initializations visible to the copy engine (async proxy);
// a block barrier follows.
__device__ __forceinline__ void mbar_init_fence() {
#if TILEINFER_WGMMA_ENABLED
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#if TILEINFER_WGMMA_ENABLED
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
#endif
}
// One arrival that also announces `bytes` of copies completing on the barrier.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if TILEINFER_WGMMA_ENABLED
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if TILEINFER_WGMMA_ENABLED
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
#endif
}

// Bulk tensor copies global -> shared through a tensor map (a __grid_constant__
// kernel parameter), completing `bytes of the box` on `bar`. Coordinates are
// element indices, innermost first; a box partly or wholly outside the tensor
// is filled with zeros (and still counts its full size), which is what makes
// any page id safe to copy from.
__device__ __forceinline__ void tma_load_3d(void* dst, const void* map, uint64_t* bar, int c0, int c1, int c2) {
#if TILEINFER_WGMMA_ENABLED
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::
          "r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
#endif
}
__device__ __forceinline__ void tma_load_4d(void* dst, const void* map, uint64_t* bar, int c0, int c1, int c2,
                                            int c3) {
#if TILEINFER_WGMMA_ENABLED
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
#endif
}
// A bulk copy of `bytes` contiguous bytes global -> shared, completing on
// `bar` (both addresses 16-byte aligned, bytes a multiple of 16). No bounds:
// the caller copies only from inside its tensor.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if TILEINFER_WGMMA_ENABLED
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
#endif
}
__device__ __forceinline__ void prefetch_tma_map(const void* map) {
#if TILEINFER_WGMMA_ENABLED
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// Named barriers (ids 1..15; 0 is __syncthreads): `threads` arrivals complete
// one; sync waits for it, arrive does not.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Four 8 x 8 matrices of 16-bit elements from a warp's registers to shared
// memory (stmatrix): register i of lane l holds elements 2 (l % 4), + 1 of
// row l / 4 of matrix i (the mma accumulator's layout, packed), and lane l
// gives the address of row l % 8 of matrix l / 8 (16 bytes).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
#if TILEINFER_WGMMA_ENABLED
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
#endif
}

// Register reallocation between warpgroups: every thread of the warpgroup
// executes it. Needs a register cap at entry (__launch_bounds__(threads, 1)).
template <int kRegs>
__device__ __forceinline__ void regs_dealloc() {
#if TILEINFER_WGMMA_ENABLED
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void regs_alloc() {
#if TILEINFER_WGMMA_ENABLED
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

}  // namespace sm90
}  // namespace tileinfer
