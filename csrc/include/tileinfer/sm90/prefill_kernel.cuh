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
// and, below it, hand_out_gate: the one-thread kernel a mixed step's decodes
// wait behind until the hand-out launch's blocks have started.
// The producer warpgroup gives registers up (setmaxnreg) to the consumers,
// whose S and O accumulators need most of the register file.
#pragma once

#include "../common.cuh"
#include "prefill_consumer.cuh"
#include "prefill_producer.cuh"

namespace tileinfer {
namespace sm90 {

// kHandOut: the items from p.item_counter (a mixed step beside its
// decodes), else the scheduler's order. kCap: what the consumers do with a
// soft-cap (prefill_consumer.cuh; the host launches kFixedOffset where
// fixed_offset_fits, kNone for a quantized cache's uncapped steps).
template <class Cfg, bool kHandOut = false, CapForm kCap = CapForm::kAny>
__global__ void __launch_bounds__(Cfg::kThreads, 1) prefill_kernel(const __grid_constant__ PrefillParams p) {
  static_assert(kCap != CapForm::kFixedOffset || Cfg::kFixedOffsetFits,
                "a fixed offset needs probabilities with fp32's range");
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
  if constexpr (kHandOut) {
    if (threadIdx.x == 0) atomicAdd(p.item_counter + 1, 1);  // (hand_out_gate below)
  }

  const PrefillScheduler sched(p);
  // Warp-uniform as far as the compiler can tell (a shuffle from lane 0):
  // wgmma in a branch it cannot prove uniform is serialized (ptxas C7518).
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  if (wg == 0) {
    regs_dealloc<Cfg::kProducerRegs>();
    if (threadIdx.x < 32) {
      prefill_produce<Cfg, kHandOut>(p, sm, sched);
    } else if constexpr (Cfg::kQuant) {
      prefill_convert<Cfg>(p, sm);
    }
  } else {
    regs_alloc<Cfg::kConsumerRegs>();
    prefill_consume<Cfg, kCap>(p, sm, wg - 1);
    allow_dependent_launch();
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built without sm_90a: the launcher only picks this kernel on a 9.0 device of an sm_90a build
#endif
}

// A mixed step's decodes start behind this one-thread kernel (prefill.cu,
// "Mixed steps beside their decodes"): it returns once `blocks` blocks of
// the first hand-out launch have started (p.item_counter[1]), or after
// kHandOutGateNs. Without it the decodes' blocks, dispatched first, would
// spread over every SM, and a prefill block, which needs a whole SM, would
// find none free until the decodes were done: the step would cost the sum
// of its parts. A graph replays both branches at once and keeps no launch
// priority, so their order is left to the block scheduler. The time limit
// keeps a prefill launch that cannot start (the GPU shared with other
// streams) from holding the decodes back more than that; the order is then
// the scheduler's again, the bits the same either way.
constexpr unsigned long long kHandOutGateNs = 20000;

__global__ void hand_out_gate(const int* started, int blocks) {
  wait_for_prior_grids();
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    int n;
    asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(n) : "l"(started) : "memory");
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (n >= blocks || t - t0 > kHandOutGateNs) break;
    __nanosleep(200);
  }
  allow_dependent_launch();  // (not before: the decodes' blocks would take SMs to wait on)
}

}  // namespace sm90
}  // namespace tileinfer
