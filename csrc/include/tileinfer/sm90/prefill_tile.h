// Tile table and parameters of the warp-specialized Hopper prefill kernel
// (prefill_kernel.cuh): one place that answers the tile shape for a head dim.
#pragma once

#include <cuda.h>  // CUtensorMap

#include "../params.h"

namespace tileinfer {
namespace sm90 {

// The kernel's launch parameters: the attention params plus the tensor maps of
// the bulk copies, built on the host from the tensors' shapes and pointers
// (none depends on a sequence length, so a captured graph stays valid).
struct PrefillParams {
  AttentionParams a;
  CUtensorMap q_map;  // q as [num_tokens][num_q_heads][head_dim], box {64, group, kBlockM / group}
  CUtensorMap k_map;  // a pool as [num_pages][num_kv_heads][page_size][head_dim], box {64, rows, 1, 1}
  CUtensorMap v_map;
  int num_row_tiles;  // ceil(group * max_q_len / kBlockM)
  int box_rows;       // keys per box: min(page_size, kBlockN)
};

// Shape of one head dim's instantiation.
//   - Three warpgroups: a producer (one warp issues the copies; the
//     warpgroup gives its registers up) and two consumers of 64 query rows
//     each, so kBlockM = 128. The consumers take turns at the tensor cores
//     (ping-pong): one's softmax runs while the other's products do.
//   - kBlockN keys per stage: 128 at d <= 128 (the S accumulator is 64
//     registers, O 32 / 64); 64 at d 256, whose O accumulator is 128 registers.
//   - kStages: 4 at d 64 (144 KB), 2 at d 128 (160 KB) and d 256 (192 KB).
//     Keys and values of a stage are released separately (prefill_smem.cuh),
//     so two stages keep the next keys in flight; a third at d 128 measured
//     no gain.
template <typename T_, int D_>
struct PrefillTile {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kBlockN = D <= 128 ? 128 : 64;
  static constexpr int kStages = D == 64 ? 4 : 2;
  // Intra-warpgroup overlap (prefill_consumer.cuh): the softmax of tile i
  // runs while the P V product of tile i - 1 does, which keeps a second S
  // and P in registers. At d 256 the 128-register O accumulator leaves no room
  // for them (spills, and slower than without).
  static constexpr bool kOverlap = D <= 128;
  // Registers per thread after setmaxnreg. The warpgroups trade within what
  // the block got at launch (65536 / kThreads, rounded down to 8: 168): the
  // consumers' increase waits until the producer's decrease has freed enough,
  // so a split beyond that total never starts (it hangs, it does not fail).
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static_assert(D == 64 || D == 128 || D == 256, "head dims of the tile table");
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= kLaunchRegs * kThreads,
                "setmaxnreg: within the block's registers at launch");

  // Shared memory, in bytes, 1024-byte aligned operand tiles first.
  static constexpr int kQBytes = kBlockM * D * 2;
  static constexpr int kTileBytes = kBlockN * D * 2;  // one K or V stage
  static constexpr int kStageBytes = 2 * kTileBytes;
  // Barriers, stage masks (padded to 8 bytes) and the work item (prefill_smem.cuh).
  static constexpr int kBarBytes = (4 * kStages + 3) * 8 + (kStages + (kStages & 1)) * 4 + 64;
  static constexpr int kAlign = 1024;
  static constexpr int kSmemBytes = kAlign + kQBytes + kStages * kStageBytes + kBarBytes;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");
};

}  // namespace sm90
}  // namespace tileinfer
