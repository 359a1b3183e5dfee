// The decode split rule: how many splits each (sequence, KV head) of a decode
// step gets. Plain C++ (no torch, no CUDA): csrc/attention.cpp (the attention
// op and the op decode_num_splits) and scripts/decode_timeline.cu use it.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tileinfer {

// Splits per (sequence, KV head): enough blocks for about two per SM (the decode
// kernel's residency at d = 128) even for a single sequence, rounded down so
// that the blocks never spill a fraction of a wave past those slots: on the H200
// (132 SMs) 8 sequences at 32k positions took 320 us with 5 splits (320 blocks
// for 264 slots, 1.2 waves) and 4 splits fit one wave. Never depends on context
// length (a captured graph replays the same grid as sequences grow); empty splits
// write a neutral partial. Steps of 9-16 queries get the same rule: they had at
// most 8 splits (the seed note's choice, to keep combine's cost low), but on
// the H200 one sequence's 16-query step then took 39.9 us at 8k positions
// against 20.0 us with 32 splits, and 15.7 vs 14.6 us at 2k (9.6 vs 10.4 at 256
// positions; bench_decode, 2026-11-29). The int8 cache gets the same rule: its
// splits were sized for three blocks per SM (the narrow int8 tile), but on the
// H200 8 sequences at 32k positions ran a decode + combine step in 134.5 us with
// 4 splits (256 blocks, decode.cu's wide int8 tile, two per SM) against 140.3 us
// with 6 (384 narrow blocks, three per SM; scripts/decode_timeline.cu,
// 2026-11-29; 3-7% faster at 2, 4 and 16 sequences too): the narrow blocks'
// SMs hold three blocks or two, and the three-block ones set the pace. (Up to
// 48 splits made one int8 sequence at 32k positions 4% faster but 1k-4k
// positions 10-15% slower: the cap stays 32.)
inline int64_t decode_num_splits_for(int64_t num_sms, int64_t num_seqs, int64_t num_kv_heads) {
  const int64_t sms = num_sms > 0 ? num_sms : 8;  // 8: the CPU path's "SMs" (threads it splits over)
  constexpr int64_t per_sm = 2;
  constexpr int64_t max_splits = 32;
  const int64_t work = std::max<int64_t>(1, num_seqs * num_kv_heads);
  const int64_t want = (per_sm * sms) / work;
  return std::min(max_splits, std::max<int64_t>(1, want));
}

}  // namespace tileinfer
