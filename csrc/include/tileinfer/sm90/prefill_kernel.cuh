// The warp-specialized Hopper (sm_90a) prefill kernel: bf16 / fp16 queries
// over a cache of the same type, an int8 one or an fp8 one, head
// dims of the tile table (prefill_tile.h), work items of a KV head's whole
// group (a power of two dividing kBlockM) or of one query head. The body only
// wires the roles together:
//   prefill_scheduler.cuh  which items (row tile, sequence, head) a block takes (the producer walks it)
//   prefill_producer.cuh   one warp: bulk copies of Q and of K / V pages into a ring
//   prefill_convert.cuh    a quantized cache: three warps convert its pages to
//                          fp16 operand tiles; the consumers their queries
//   prefill_consumer.cuh   two or three warpgroups: products, mask, online softmax
//   prefill_mask.cuh       which scores are hidden
//   prefill_epilogue.cuh   normalized rows and lse out
// The producer warpgroup gives registers up (setmaxnreg) to the consumers,
// whose S and O accumulators need most of the register file.
#pragma once

#include "../common.cuh"
#include "prefill_consumer.cuh"
#include "prefill_producer.cuh"

namespace tileinfer {
namespace sm90 {

// kHandOut: the items from p.item_counter (a mixed step beside its decodes,
// bf16 / fp16 caches), else the scheduler's order. kFixedOffset: soft-capped
// scores over a bf16 cache, exponents against a fixed offset
// (prefill_consumer.cuh; the host launches it where fixed_offset_fits).
template <class Cfg, bool kHandOut = false, bool kFixedOffset = false>
__global__ void __launch_bounds__(Cfg::kThreads, 1) prefill_kernel(const __grid_constant__ PrefillParams p) {
  static_assert(!kFixedOffset || Cfg::kFixedOffsetFits, "a fixed offset needs probabilities with fp32's range");
#if TILEINFER_WGMMA_ENABLED
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const PrefillSmem<Cfg> sm(smem_raw);
  if (threadIdx.x == 0) {
    sm.init();
    prefetch_tma_map(&p.q_map);
    prefetch_tma_map(&p.k_map);
    prefetch_tma_map(&p.v_map);
  }
  __syncthreads();
  wait_for_prior_grids();  // programmatic launches (common.cuh): before any read of the step's data

  const PrefillScheduler sched(p);
  // Warp-uniform as far as the compiler can tell (a shuffle from lane 0):
  // wgmma in a branch it cannot prove uniform is serialized (ptxas C7518).
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  if (wg == 0) {
    regs_dealloc<Cfg::kProducerRegs>();
    if (threadIdx.x < 32) {
      prefill_produce<Cfg, kHandOut>(p, sm, sched);
    } else if constexpr (Cfg::kQuant) {
      prefill_convert<Cfg>(p, sm, sched);
    }
  } else {
    regs_alloc<Cfg::kConsumerRegs>();
    prefill_consume<Cfg, kFixedOffset>(p, sm, wg - 1);
    allow_dependent_launch();
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built without sm_90a: the launcher only picks this kernel on a 9.0 device of an sm_90a build
#endif
}

}  // namespace sm90
}  // namespace tileinfer
