// The attention op: picks decode + combine or prefill from shapes alone, so a
// captured CUDA graph takes the same path on every step, and calls them through
// the dispatcher (the same code serves CPU and CUDA).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#ifdef TILEINFER_WITH_CUDA
#include "device_attribute.h"
#endif

#include "checks.h"
#include "ops.h"

namespace tileinfer {

// Decode packs group_size * max_q_len query rows of one KV head into a tile;
// beyond 16 queries per sequence, or for a group size that is not a power of
// two, the prefill kernel is the better (and the supported) path.
bool use_decode_path(int64_t max_q_len, int64_t group_size) {
  const bool pow2 = group_size > 0 && (group_size & (group_size - 1)) == 0;
  return max_q_len >= 1 && max_q_len <= kMaxDecodeQueries && pow2 && group_size <= 16;
}

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
int64_t decode_num_splits_for(int64_t num_sms, int64_t num_seqs, int64_t num_kv_heads, int64_t max_q_len,
                              int64_t group_size, int64_t head_dim, bool int8) {
  const int64_t sms = num_sms > 0 ? num_sms : 8;  // 8: the CPU path's "SMs" (threads it splits over)
  (void)max_q_len, (void)group_size, (void)head_dim, (void)int8;  // the same rule for every step and cache
  constexpr int64_t per_sm = 2;
  constexpr int64_t max_splits = 32;
  const int64_t work = std::max<int64_t>(1, num_seqs * num_kv_heads);
  const int64_t want = (per_sm * sms) / work;
  return std::min(max_splits, std::max<int64_t>(1, want));
}

int64_t sm_count(const at::Device& device) {
#ifdef TILEINFER_WITH_CUDA
  if (device.is_cuda()) return cached_device_attribute<cudaDevAttrMultiProcessorCount>(device.index());
#endif
  return 0;
}

int64_t decode_num_splits(const at::Device& device, int64_t num_seqs, int64_t num_kv_heads, int64_t max_q_len,
                          int64_t group_size, int64_t head_dim, bool int8) {
  return decode_num_splits_for(sm_count(device), num_seqs, num_kv_heads, max_q_len, group_size, head_dim, int8);
}

void attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
               const at::Tensor& block_tables, const at::Tensor& seq_lens, const at::Tensor& cu_seqlens_q,
               int64_t max_q_len, double scale, bool causal, const std::optional<at::Tensor>& k_scale,
               const std::optional<at::Tensor>& v_scale, const std::optional<at::Tensor>& k_smooth) {
  const PagedShape s = check_paged_attention("attention", q, k_cache, v_cache, block_tables, seq_lens,
                                             cu_seqlens_q, max_q_len, k_scale, v_scale, k_smooth);
  check_token_tensor("attention", "out", out, q.size(0), q.size(1), s.head_dim, q.scalar_type(), q.device());
  const int64_t group = q.size(1) / s.num_kv_heads;

  if (use_decode_path(max_q_len, group)) {
    static auto decode_op = c10::Dispatcher::singleton()
                                .findSchemaOrThrow("tileinfer_attn::decode", "")
                                .typed<decltype(cpu::decode)>();
    static auto combine_op = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("tileinfer_attn::combine", "")
                                 .typed<decltype(cpu::combine)>();
    const int64_t splits =
        decode_num_splits(q.device(), s.num_seqs, s.num_kv_heads, max_q_len, group, s.head_dim, s.int8);
#ifdef TILEINFER_WITH_CUDA
    if (splits == 1 && q.is_cuda()) {  // nothing to merge: no partials, no combine launch
      cuda::decode_single_split(out, s, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len, scale,
                                causal, k_scale, v_scale, k_smooth);
      return;
    }
#endif
    const auto f32 = q.options().dtype(at::kFloat);
    at::Tensor partial_out = at::empty({splits, q.size(0), q.size(1), s.head_dim}, f32);
    at::Tensor partial_lse = at::empty({splits, q.size(0), q.size(1)}, f32);
    decode_op.call(partial_out, partial_lse, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
                   max_q_len, scale, causal, k_scale, v_scale, k_smooth);
    combine_op.call(out, std::nullopt, partial_out, partial_lse);
  } else {
    static auto prefill_op = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("tileinfer_attn::prefill", "")
                                 .typed<decltype(cpu::prefill)>();
    prefill_op.call(out, std::nullopt, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len,
                    scale, causal, k_scale, v_scale, k_smooth);
  }
}

}  // namespace tileinfer

TORCH_LIBRARY_IMPL(tileinfer_attn, CPU, m) { m.impl("attention", &tileinfer::attention); }
#ifdef TILEINFER_WITH_CUDA
TORCH_LIBRARY_IMPL(tileinfer_attn, CUDA, m) { m.impl("attention", &tileinfer::attention); }
#endif
