// Shared memory of the Hopper prefill kernel and the barriers between its
// producer and consumers.
//
//   q       [kQBuffers][D / 64][kBlockM rows][128 B]   the items' queries (kStagedStore:
//           then their output rows, prefill_epilogue.cuh)
//   stages  [kStages][K, V][D / 64][kBlockN rows][128 B] the ring of key tiles
//   raw     [kRawSlots][kBlockN rows][D B]   quantized only: K or V tiles as stored
//           (+ per-vector scales: [kBlockN] fp32, the tile's k or v scales)
//   full_k[s]  the stage's key tile landed (1 arrival: the producer's, + bytes;
//              quantized: one arrival per converter thread)
//   empty_k[s] the consumers are done with it (one arrival per consumer warp)
//   full_v[s], empty_v[s]  the same for the value tile
//   q_full[b] / q_empty[b]   the same for query tile b, once per item (kStagedStore:
//              empty once the epilogue has stored the rows it staged there;
//              quantized: also one arrival per converter warp, once it has
//              read item[b])
//   item[b]    the work item of query tile b (written by the producer before
//              its arrival on q_full[b]; inactive: no item left), which the
//              consumers and the converters take from there
//   cursor     quantized: the producer's place in a run-time hand-out
//              (prefill_scheduler.cuh; the other kernels keep it in static
//              shared memory, prefill_producer.cuh)
//   tail       copies of a stage that the producer finishes itself (below)
//   stage_mask[s]  bit b: box b of the stage is on a page outside the pool
//   raw_full[r] / raw_empty[r]  a raw slot landed (1 arrival + bytes) / the
//              converters are done with it (one arrival per converter thread)
//   raw_mask[r]    stage_mask of a raw slot, handed on by the converters; with
//              kOwnTile set, the slot's tile is one of the step's own, copied
//              into its stage in fp16 (prefill_own_kv.cuh), and the raw slot
//              holds nothing else
// Every thread that reads or writes the raw slots arrives
// on their barriers itself, after its own accesses; the other hand-offs have
// lane 0 arrive for its warp after a warp or named barrier. Both order the
// accesses, but compute-sanitizer's racecheck credits an arrival only with
// its own thread's accesses: with lane 0 alone it counts the other lanes'
// accesses of the slots as hazards.
//
// Operand tiles are in the 128-byte-swizzle layout of wgmma.cuh, each 1024-byte
// aligned.
#pragma once

#include <cstdint>

#include "../attention_work.cuh"
#include "async.cuh"
#include "prefill_scheduler.cuh"
#include "prefill_tile.h"

namespace tileinfer {
namespace sm90 {

static_assert(sizeof(WorkItem) <= 64, "a work item's room in PrefillTile::kBarBytes");

// raw_mask's flag for an own tile (stage_mask's bits are boxes: 8 at most).
constexpr uint32_t kOwnTile = 1u << 31;

template <class Cfg>
struct PrefillSmem {
  static constexpr int kConsumerWarps = 4 * Cfg::kConsumers;
  static_assert(!Cfg::kQuant || sizeof(HandOutCursor) <= Cfg::kCursorBytes,
                "the cursor's room in PrefillTile::kBarBytes");

  uint8_t* q_tiles;
  uint8_t* stages;
  uint8_t* raw;
  uint64_t* full_k;
  uint64_t* empty_k;
  uint64_t* full_v;
  uint64_t* empty_v;
  uint64_t* q_full;
  uint64_t* q_empty;
  uint64_t* tail;
  uint64_t* raw_full;
  uint64_t* raw_empty;
  uint32_t* stage_mask;
  uint32_t* raw_mask;
  WorkItem* item;
  HandOutCursor* cursor;  // quantized only

  __device__ explicit PrefillSmem(uint8_t* buffer) {
    // The swizzle is a function of address bits: align to 1024 bytes whatever
    // the dynamic buffer's base (kAlign bytes of slack).
    const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(buffer));
    q_tiles = buffer + ((Cfg::kAlign - (base & (Cfg::kAlign - 1))) & (Cfg::kAlign - 1));
    stages = q_tiles + Cfg::kQBuffers * Cfg::kQBytes;
    raw = stages + Cfg::kStages * Cfg::kStageBytes;
    full_k = reinterpret_cast<uint64_t*>(raw + Cfg::kRawSlots * Cfg::kRawSlotBytes);
    empty_k = full_k + Cfg::kStages;
    full_v = empty_k + Cfg::kStages;
    empty_v = full_v + Cfg::kStages;
    q_full = empty_v + Cfg::kStages;
    q_empty = q_full + Cfg::kQBuffers;
    tail = q_empty + Cfg::kQBuffers;
    raw_full = tail + 1;
    raw_empty = raw_full + Cfg::kRawSlots;
    stage_mask = reinterpret_cast<uint32_t*>(raw_empty + Cfg::kRawSlots);
    raw_mask = stage_mask + Cfg::kStages + (Cfg::kStages & 1);
    item = reinterpret_cast<WorkItem*>(raw_mask + Cfg::kRawSlots + (Cfg::kRawSlots & 1));  // 8-byte aligned
    cursor = reinterpret_cast<HandOutCursor*>(reinterpret_cast<uint8_t*>(item) + 64 * Cfg::kQBuffers);
  }

  __device__ uint8_t* q(int b) const { return q_tiles + b * Cfg::kQBytes; }
  __device__ uint8_t* k(int s) const { return stages + s * Cfg::kStageBytes; }
  __device__ uint8_t* v(int s) const { return k(s) + Cfg::kTileBytes; }
  __device__ uint8_t* raw_tile(int r) const { return raw + r * Cfg::kRawSlotBytes; }
  // Per-vector scales: the scales of a raw slot's tile (k or v, as the tile).
  __device__ float* raw_scales(int r) const { return reinterpret_cast<float*>(raw_tile(r) + Cfg::kBlockN * Cfg::D); }

  // One thread, before the block barrier that precedes every other use.
  __device__ void init() const {
    constexpr int kFillers = Cfg::kQuant ? 32 * Cfg::kConverterWarps : 1;
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbar_init(&full_k[s], kFillers);
      mbar_init(&empty_k[s], kConsumerWarps);
      mbar_init(&full_v[s], kFillers);
      mbar_init(&empty_v[s], kConsumerWarps);
    }
    for (int r = 0; r < Cfg::kRawSlots; ++r) {
      mbar_init(&raw_full[r], 1);
      mbar_init(&raw_empty[r], 32 * Cfg::kConverterWarps);
    }
    for (int b = 0; b < Cfg::kQBuffers; ++b) {
      mbar_init(&q_full[b], 1);
      mbar_init(&q_empty[b], kConsumerWarps + Cfg::kConverterWarps);
    }
    mbar_init(tail, 1);
    mbar_init_fence();
  }
};

// Lane 0's work item, in every lane of the warp.
__device__ __forceinline__ WorkItem warp_broadcast(const WorkItem& w) {
  static_assert(sizeof(WorkItem) % 4 == 0, "WorkItem: whole words");
  WorkItem r;
  const uint32_t* from = reinterpret_cast<const uint32_t*>(&w);
  uint32_t* to = reinterpret_cast<uint32_t*>(&r);
#pragma unroll
  for (int i = 0; i < int(sizeof(WorkItem) / 4); ++i) to[i] = __shfl_sync(0xffffffffu, from[i], 0);
  return r;
}

// Position in the ring of a running tile count: stage and the parity of the
// stage's current phase.
template <int kStages>
struct RingSlot {
  int stage;
  uint32_t parity;
  __device__ explicit RingSlot(uint32_t count) : stage(count % kStages), parity((count / kStages) & 1) {}
};

}  // namespace sm90
}  // namespace tileinfer
