// Tile table and parameters of the warp-specialized Hopper prefill kernel
// (prefill_kernel.cuh): one place that answers the tile shape for a head dim.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "../params.h"
#include "../quant.cuh"
#include "prefill_order.h"

namespace tileinfer {
namespace sm90 {

// The kernel's launch parameters: the attention params plus the tensor maps of
// the bulk copies, built on the host from the tensors' shapes and pointers
// (none depends on a sequence length, so a captured graph stays valid).
struct PrefillParams {
  AttentionParams a;
  CUtensorMap q_map;  // q as [num_tokens][num_q_heads][head_dim], box {64, item_group, kBlockM / item_group}
  CUtensorMap k_map;  // a pool as [num_pages][num_kv_heads][page_size][head_dim], box {64, rows, 1, 1}
  CUtensorMap v_map;  //   (quantized: bytes, box {D, rows, 1, 1}, no swizzle)
  // The query heads of a work item (item_group) and the items' heads per
  // sequence (item_heads = num_q_heads / item_group): a group that is a
  // power of two dividing kBlockM packs all of a KV head's query heads into
  // an item, whose key and value tiles are then copied once for them all;
  // other groups (prefill.cu, prefill_item_group) take an item per query
  // head, each copying its KV head's tiles, as a kernel without GQA packing
  // does.
  int item_group;
  int item_heads;
  int num_row_tiles;  // ceil(item_group * max_q_len / kBlockM)
  int box_rows;       // keys per box: min(page_size, kBlockN)
  PrefillOrder order;  // prefill_order.h
  int tail_pairs;      // kPairs: the last pairs, taken item by item
  // The run-time hand-out (prefill_scheduler.cuh), two zeroed ints: [0] the
  // next item's number, [1] the blocks started (prefill_kernel.cuh,
  // hand_out_gate); nullptr: the order above.
  int* item_counter;
  // A quantized cache: the step's own keys and values in fp16
  // (prefill_own_kv.cuh), [num_tokens][num_kv_heads][head_dim], box {64, 1,
  // kBlockN}, and whether their rows map one to one to the sequences'
  // positions (written by that pass); own_ok null: every tile through the
  // converters.
  // Past the tokens' rows, prefix rows: pre_base[s] (written by that pass)
  // is the row past the tokens' of sequence s's position 0, its cached
  // prefix's rows holding positions 0 .. seq_len - q_count; -1 where its
  // prefix's tiles go through the converters; pre_base null: no prefix rows.
  CUtensorMap own_k_map;
  CUtensorMap own_v_map;
  const int* own_ok;
  const int* pre_base;
  // Per-vector scales: the largest |k_scale| and |v_scale| of each (sequence,
  // KV head), [num_seqs][num_kv_heads] float bits (prefill_scale_range.cuh).
  const uint2* scale_top;
};

// Shape of one head dim's instantiation.
//   - A producer warpgroup (one warp issues the copies; the warpgroup gives
//     its registers up) and kConsumers consumer warpgroups of 64 query rows
//     each, so kBlockM = 128 (192 with three, at d 64). The consumers take
//     turns at the tensor cores (ping-pong): one's products run while the
//     others' softmax does.
//   - kBlockN keys per stage: 128 at d <= 128 (the S accumulator is 64
//     registers, O 32 / 64); 64 at d 256, whose O accumulator is 128 registers.
//     Every head dim runs the consumers' in-warpgroup overlap
//     (prefill_consumer.cuh), which keeps a second S and its P in registers:
//     at d 256, 128 + 32 + 16 of them fit in kConsumerRegs without spills.
//   - kStages: 4 at d 64 (161 KB; 177 KB with 192 query rows), 2 at d 128 (193 KB)
//     and d 256 (193 KB), the query buffers included.
//     Keys and values of a stage are released separately (prefill_smem.cuh),
//     so two stages keep the next keys in flight; a third at d 128 measured
//     no gain.
//   - A quantized cache (CacheT = __nv_fp8_e4m3 or int8_t): the pages land
//     as stored (bytes) in a second ring of kRawSlots slots, one K or V
//     tile each, and the producer warpgroup's three other warps convert them
//     to fp16 operand tiles (exact: every e4m3 and int8 value is an fp16
//     number; prefill_convert.cuh). The products run in fp16 whatever the
//     queries' type QT: each consumer warpgroup turns its query rows into
//     fp16 once per item (prefill_consumer.cuh), and the scales go on the
//     scores and the output: one per tensor (fp8), or (kVectorScales: one
//     per key and value vector, which travel with their tile's raw slot) a
//     power of two per sequence and KV head, the converters having
//     multiplied each key and value by its scale over that power
//     (prefill_scale_range.cuh). d 64 and 128 (80 and 96 through 128); d 256
//     has no room for the raw ring.
template <typename QT_, int D_, typename CacheT_ = QT_, bool kVectorScales_ = false, int kConsumers_ = 2>
struct PrefillTile {
  using QT = QT_;        // queries and output
  using CacheT = CacheT_;
  static constexpr bool kQuant = kQuantized<CacheT>;
  static constexpr bool kVectorScales = kVectorScales_;
  using T = std::conditional_t<kQuant, __half, QT>;  // the products' operands
  static constexpr int D = D_;
  // Consumer warpgroups: two, or three at d 64 over a cache of the queries'
  // type (192 query rows, as FlashAttention 3's d 64 tile) for steps with
  // enough items (prefill.cu, prefill_three_consumers). A d 64 tile's
  // products take half the tensor-core time of d 128's for the same softmax
  // per score, so two warpgroups leave the tensor cores idle while both wait
  // on their softmax chains; a third keeps one more chain in flight. Its
  // registers fit at d 64 only (O of 32, S and P of 96 a thread).
  static constexpr int kConsumers = kConsumers_;
  static_assert(kConsumers == 2 || (kConsumers == 3 && D == 64 && !kQuant),
                "three consumer warpgroups at d 64 over a cache of the queries' type only");
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kBlockN = D <= 128 ? 128 : 64;
  static constexpr int kStages = D == 64 ? 4 : 2;
  // Registers per thread after setmaxnreg. The warpgroups trade within what
  // the block got at launch (65536 / kThreads, rounded down to 8: 168 with
  // two consumers, 128 with three): the
  // consumers' increase waits until the producer's decrease has freed enough,
  // so a split beyond that total never starts (it hangs, it does not fail).
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kConverterWarps = kQuant ? 3 : 0;  // warps 1-3 of the producer warpgroup
  // How far (log2) a row's scores may rise above its running maximum before
  // it moves (SoftmaxRow::enter_tile): O is rescaled only on the tiles where
  // it does, which gained 1-3% at d 128 and 256 (O of 64 and 128 registers a
  // thread) and cost 1% at d 64. P then reaches 2^kSoftmaxSlack, which bf16
  // and fp16 hold. A quantized cache's P also carries its headroom (below),
  // with a slack of 4 (fp8 per tensor 1 x 2k-8k 2-5% faster than with none;
  // 8 measured no faster than 4, docs/PERFORMANCE.md, and leaves P less room).
  static constexpr int kSoftmaxSlack = D == 64 ? 0 : kQuant ? 4 : 8;
  // A quantized cache: log2 of what the probabilities are multiplied by
  // before they are rounded to fp16 for the P V product (the output factor
  // takes it back), so that the small ones stay out of fp16's subnormals:
  // with 2^(15 - slack), those down to 2^-(29 - slack) of the row's
  // running maximum stay fp16 normals, and the largest, 2^15, in range.
  static constexpr int kLog2Headroom = kQuant ? 15 - kSoftmaxSlack : 0;
  static constexpr float kHeadroom = static_cast<float>(1 << kLog2Headroom);
  // The headroom as OnlineSoftmax::update's bias (log2 of what P comes out of
  // the exp2 multiplied by).
  static constexpr float kProbBias = kQuant ? static_cast<float>(kLog2Headroom) : 0.f;
  // Whether P (of type T) has fp32's exponent range, which soft-capped
  // scores against a fixed offset need (softmax.cuh, fixed_offset): bf16
  // products; fp16's range is too narrow for caps past about 10.
  static constexpr bool kFixedOffsetFits = std::is_same_v<T, __nv_bfloat16>;
  // A quantized cache's converters (prefill_convert.cuh) take 56: with 40
  // they spilled and kept four rows in flight, and the kernel waited on them;
  // with 56 they hold six, and the consumers, at 224, spill only around an
  // item's start and end, not in the key loop. The bf16 / fp16 consumers
  // take all they can.
  // Three consumers share 128 x 512 registers: 160 each and 32 for the
  // producer warpgroup, FlashAttention 3's split for its 192-row tiles.
  static constexpr int kProducerRegs = kQuant ? 56 : kConsumers == 3 ? 32 : 40;
  static constexpr int kConsumerRegs = kQuant ? 224 : kConsumers == 3 ? 160 : 232;
  static_assert(D == 64 || D == 128 || D == 256, "head dims of the tile table");
  static_assert(std::is_same_v<CacheT, QT> || (kQuant && D <= 128),
                "a cache of the queries' type, or a quantized one at d <= 128");
  static_assert(!kVectorScales || kQuant, "per-vector scales: a quantized cache");
  static_assert(!std::is_same_v<CacheT, int8_t> || kVectorScales, "an int8 cache has per-vector scales");
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= kLaunchRegs * kThreads,
                "setmaxnreg: within the block's registers at launch");

  // Shared memory, in bytes, 1024-byte aligned operand tiles first.
  static constexpr int kQBytes = kBlockM * D * 2;  // one query tile
  static constexpr int kTileBytes = kBlockN * D * 2;  // one K or V stage
  static constexpr int kStageBytes = 2 * kTileBytes;
  // Quantized: a raw slot holds one K or V tile as stored ([kBlockN][D]
  // bytes), with per-vector scales also that tile's kBlockN scales; 2 slots
  // at d 128 (the second query buffer takes a third's room), 4 at d 64.
  static constexpr int kScaleBytes = kVectorScales ? kBlockN * 4 : 0;
  static constexpr int kRawSlotBytes = kQuant ? kBlockN * D + kScaleBytes : 0;
  static constexpr int kRawSlots = !kQuant ? 0 : D == 128 ? 2 : 4;
  // Query tiles in flight: two where shared memory holds them, so that the
  // producer copies the next item's queries and first tiles while this
  // item's last tiles are computed (with one, it waits for this item's last
  // S). Not at d 256.
  static constexpr int kQBuffers = D == 256 ? 1 : 2;
  // With two, an item's query buffer also stages its output rows, so that
  // they leave as whole 16-byte chunks (prefill_epilogue.cuh): the producer
  // refills it only after the epilogue, while the other buffer holds the
  // next item's queries.
  static constexpr bool kStagedStore = kQBuffers == 2;
  // Barriers, stage and raw-slot masks (each padded to 8 bytes), the work
  // items and, quantized, the run-time hand-out's cursor (prefill_smem.cuh).
  // The other kernels keep the cursor in static shared memory, where beside
  // the 1024-byte aligned dynamic buffer it takes 1024 bytes: more than
  // int8 at d 128 has left of the 227 KB a block may have.
  static constexpr int kCursorBytes = kQuant ? 4 * (2 + 32) : 0;  // HandOutCursor: 2 + 32 ints (prefill_smem.cuh checks)
  static constexpr int kBarBytes = (4 * kStages + 2 * kQBuffers + 1 + 2 * kRawSlots) * 8 +
                                   (kStages + (kStages & 1)) * 4 + (kRawSlots + (kRawSlots & 1)) * 4 +
                                   64 * kQBuffers + kCursorBytes;
  static constexpr int kAlign = 1024;
  static constexpr int kSmemBytes =
      kAlign + kQBuffers * kQBytes + kStages * kStageBytes + kRawSlots * kRawSlotBytes + kBarBytes;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");
};

}  // namespace sm90
}  // namespace tileinfer
