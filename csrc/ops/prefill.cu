// CUDA implementation of `prefill` (SPEC section 2): the tensor-core tile
// kernel (attention_kernel.cuh) with the prefill work mapping for bf16 / fp16,
// the CUDA-core kernel (attention_fp32.cuh) for fp32.
#include <cstdlib>
#include <optional>
#include <string>
#include <type_traits>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "attention_host.h"
#include "checks.h"
#include "device_attribute.h"
#include "ops.h"
#include "tileinfer/attention_wgmma.cuh"
#include "tileinfer/dispatch.h"

namespace tileinfer::cuda {
namespace {

// Two tile shapes, 4 warps each. Measured on an H200 (bf16, 32 query / 8 KV
// heads, d = 128, page 64, one causal prompt; TFLOP/s of causal FLOPs):
//              512    1k     2k     8k     16k
//   64-row     110    197    237    275    281
//   128-row    75*    143*   252    293    300     (* with 64-key tiles: 242, 289, 295 at 2k-16k)
//   (torch flash SDPA 71 / - / 208 / 316 / 326; cuDNN SDPA 98 / - / 414 / 600 / 630)
// - 64-row tiles: 16 rows per warp, Q fragments in registers, keys 64 at a time,
//   two stages (the other resident block's math hides each block's copies).
//   Twice the blocks of the 128-row tile: short prompts fill the 132 SMs. Also
//   d = 256, whose 128-register accumulator leaves room for a 32-key S slice only.
// - 128-row tiles: 32 rows per warp, so each K / V fragment read from shared
//   memory feeds two mma row tiles (half the ldmatrix traffic per mma); Q is
//   re-read from shared memory per tile. 32-key tiles keep it within 255
//   registers without spills (64-key tiles spilled and ran 1-4% slower), three
//   stages; ~102 KB of shared memory, two blocks per SM. d <= 128.
// - int8 cache: the same two shapes (integer scores, fp16 P V; the 128-row tile
//   converts each V tile once for twice the rows); the int8 stages are half the
//   bytes, so the 64-row tile keeps three of them at d <= 128.
template <typename T, int D, typename CacheT = T>
using PrefillTileSmall = TileConfig<TileElement<T, CacheT>, D, 4, 1, 1, (D == 256 ? 32 : 64),
                                    (std::is_same_v<CacheT, int8_t> && D <= 128 ? 3 : 2), CacheT, T>;
template <typename T, int D, typename CacheT = T>
using PrefillTileLarge = TileConfig<TileElement<T, CacheT>, D, 4, 1, 2, 32, 3, CacheT, T>;

// Shapes only (the same choice on every call of a captured graph): 128-row
// tiles from 2048 queries on (measured crossover between 1k and 2k, above).
// TILEINFER_PREFILL_ROWS=64|128 forces one (tests cover both on small problems).
bool use_large_prefill_tile(int64_t max_q_len, int64_t head_dim) {
  if (head_dim > 128) return false;
  if (const char* force = std::getenv("TILEINFER_PREFILL_ROWS")) return std::string(force) == "128";
  return max_q_len >= 2048;
}

// Hopper: the wgmma kernel (attention_wgmma.cuh) for bf16 / fp16 queries over
// a cache of the same type, head dim 64, 128 or 256, on a 9.0 device of a
// build with sm_90a code (setup.py defines TILEINFER_SM90A then; without that
// code the kernel would trap). 128 query rows (two warpgroups) x 128-key tiles
// (d 256: 64-key tiles, whose m64n256 P V accumulator is 128 registers), two
// stages. H200, bf16, 32 q / 8 KV heads, causal, TFLOP/s, 2026-11-29
// (bench_wgmma_prefill.py):
//                        1x2k   1x8k   1x16k  4x2k   8x512
//   d 128 tile kernel    251    304    318    272    164
//   d 128 wgmma 128x128  327    431    445    342    184
//   d 128 wgmma 64-key   291    351    366    300    186   (64-key tiles, 3 stages)
//   d 256 tile kernel    232    260    266    237    175
//   d 256 wgmma 128x64   395    458    465    383    244
// TILEINFER_PREFILL_WGMMA=0 (read at every call) turns it off, for A/B runs.
bool use_wgmma_prefill(const PagedShape& s, at::ScalarType dtype, int device) {
#ifdef TILEINFER_SM90A
  const char* env = std::getenv("TILEINFER_PREFILL_WGMMA");
  if (env != nullptr && std::string(env) == "0") return false;
  if (s.int8 || (s.head_dim != 64 && s.head_dim != 128 && s.head_dim != 256)) return false;
  if (dtype != at::ScalarType::BFloat16 && dtype != at::ScalarType::Half) return false;
  return cached_device_attribute<cudaDevAttrComputeCapabilityMajor>(device) == 9 &&
         cached_device_attribute<cudaDevAttrComputeCapabilityMinor>(device) == 0;
#else
  return false;
#endif
}
template <typename T, int D>
using WgmmaPrefill = WgmmaPrefillConfig<T, D, 2, (D == 256 ? 64 : 128), 2>;
template <class Cfg>
void launch_wgmma(const AttentionParams& p, cudaStream_t stream) {
  launch_attention<attention_wgmma_kernel<Cfg, PrefillWork>, Cfg, PrefillWork>("prefill", p, stream);
}

}  // namespace

void prefill(at::Tensor& out, const std::optional<at::Tensor>& lse, const at::Tensor& q,
             const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& block_tables,
             const at::Tensor& seq_lens, const at::Tensor& cu_seqlens_q, int64_t max_q_len, double scale,
             bool causal, const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
             const std::optional<at::Tensor>& k_smooth) {
  const PagedShape s = check_paged_attention("prefill", q, k_cache, v_cache, block_tables, seq_lens,
                                             cu_seqlens_q, max_q_len, k_scale, v_scale, k_smooth);
  check_token_tensor("prefill", "out", out, q.size(0), q.size(1), s.head_dim, q.scalar_type(), q.device());
  if (lse.has_value()) check_lse("prefill", "lse", *lse, q.size(0), q.size(1), q.device());
  const c10::cuda::CUDAGuard guard(q.device());
  AttentionParams p = make_attention_params("prefill", s, q, k_cache, v_cache, block_tables, seq_lens,
                                            cu_seqlens_q, max_q_len, scale, causal, k_scale, v_scale,
                                            k_smooth);
  if (q.size(0) == 0 || q.size(1) == 0 || s.num_seqs == 0 || max_q_len == 0) return;

  // Misaligned views (odd offsets or strides) go through aligned copies; rows
  // of no sequence keep their contents through the copy back.
  const at::Tensor q_c = rows_aligned16(q) ? q : q.contiguous();
  at::Tensor target = rows_aligned16(out) ? out : out.contiguous();
  p.q = q_c.data_ptr();
  p.q_stride_token = q_c.stride(0);
  p.q_stride_head = q_c.stride(1);
  p.out = target.data_ptr();
  p.o_stride_token = target.stride(0);
  p.o_stride_head = target.stride(1);
  p.lse = lse.has_value() ? lse->data_ptr<float>() : nullptr;

  TILEINFER_CHECK(p.group_size * max_q_len < (int64_t(1) << 31), "prefill: group size * max_q_len must fit in int32");
  // On max_q_len, not on the packed rows (group x max_q_len): the crossover
  // below was measured in blocks, and packing keeps the block count.
  const bool large = use_large_prefill_tile(max_q_len, s.head_dim);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (use_wgmma_prefill(s, q.scalar_type(), q.get_device())) {
    TILEINFER_DISPATCH_HALF(q.scalar_type(), "prefill", [&] {
      TILEINFER_DISPATCH_HEAD_DIM(s.head_dim, "prefill",
                                  [&] { launch_wgmma<WgmmaPrefill<scalar_t, HEAD_DIM>>(p, stream); });
    });
    if (!target.is_same(out)) out.copy_(target);
    return;
  }
  TILEINFER_DISPATCH_FLOAT(q.scalar_type(), "prefill", [&] {
    TILEINFER_DISPATCH_HEAD_DIM(s.head_dim, "prefill", [&] {
      if constexpr (std::is_same_v<scalar_t, float>) {
        launch_fp32<HEAD_DIM, PrefillWork>("prefill", p, stream);
      } else if (s.int8) {
        if constexpr (HEAD_DIM <= 128) {
          if (large) {
            return launch_tile<PrefillTileLarge<scalar_t, HEAD_DIM, int8_t>, PrefillWork>("prefill", p,
                                                                                                     stream);
          }
        }
        launch_tile<PrefillTileSmall<scalar_t, HEAD_DIM, int8_t>, PrefillWork>("prefill", p, stream);
      } else {
        if constexpr (HEAD_DIM <= 128) {
          if (large) return launch_tile<PrefillTileLarge<scalar_t, HEAD_DIM>, PrefillWork>("prefill", p, stream);
        }
        launch_tile<PrefillTileSmall<scalar_t, HEAD_DIM>, PrefillWork>("prefill", p, stream);
      }
    });
  });
  if (!target.is_same(out)) out.copy_(target);
}

}  // namespace tileinfer::cuda

TORCH_LIBRARY_IMPL(tileinfer_attn, CUDA, m) { m.impl("prefill", &tileinfer::cuda::prefill); }
