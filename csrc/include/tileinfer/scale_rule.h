// The per-vector scale that the cache writes store (GPU: inputs.cuh; CPU:
// cpu/inputs.cpp): amax / kMax in fp32, rounded up to kBits significant bits
// (4 for int8, whose values take 7; 7 for e4m3, whose values take 4). A stored
// value times such a scale then has at most 11 significant bits, an fp16
// number once a power of two puts it in fp16's range, which is how the Hopper
// prefill makes its fp16 operands exactly (sm90/prefill_scale_range.cuh).
// Rounding up keeps every x / scale within +-kMax. reference.round_scale_up is
// the same rule in PyTorch.
#pragma once

#include <cstdint>

#include "sm90/host_device.h"

namespace tileinfer {

// The bits of a positive float, its fraction cut to kBits - 1 bits, rounded
// up; inf and NaN stay as they are.
template <int kBits>
TILEINFER_HD uint32_t round_scale_bits_up(uint32_t bits) {
  constexpr uint32_t kDrop = (1u << (24 - kBits)) - 1;  // fraction bits below the kept ones
  return (bits & kDrop) != 0 && (bits & 0x7f800000u) != 0x7f800000u ? (bits | kDrop) + 1 : bits;
}

}  // namespace tileinfer
