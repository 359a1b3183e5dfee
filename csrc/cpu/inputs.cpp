// CPU rms_norm, rope, cache_write (plain and quantizing: int8, fp8) and the fused
// attention_inputs. The fused op is the per-row helpers of the separate ops
// composed, with the same intermediate rounding to the element type, so it is
// bit-identical to rms_norm + rope + cache_write.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "checks.h"
#include "cpu_common.h"
#include "ops.h"
#include "tileinfer/scale_rule.h"

namespace tileinfer::cpu {
namespace {

using detail::from_float;
using detail::HostKV;
using detail::to_float;

// ---------------------------------------------------------------------------
// Per-row math, shared by the separate ops and the fused one.

// Qwen3's RMSNorm of one head: fp32 math, the normalized value rounded to the
// element type, then multiplied by the weight in the element type (as
// `weight * x.float().mul(rsqrt(...)).to(dtype)` does in eager PyTorch).
// out may alias x.
//
// The sum of squares is accumulated in double: the mean is then (nearly
// always) the correctly rounded fp32 value, whatever the summation order of
// the eager reference, so the result flips a rounding against it as rarely
// as possible.
template <typename T>
void rms_norm_row(T* out, const T* x, const T* weight, int64_t d, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < d; ++i) {
    const float v = to_float(x[i]);
    ss += static_cast<double>(v * v);  // the square in fp32, as the reference's pow(2)
  }
  const float mean = static_cast<float>(ss / static_cast<double>(d));
  const float inv = 1.f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < d; ++i) {
    const T normed = from_float<T>(to_float(x[i]) * inv);
    out[i] = from_float<T>(to_float(weight[i]) * to_float(normed));
  }
}

// Neox (rotate-half) rotary embedding of one head at one position: the first
// rotary_dim channels rotate in pairs (i, i + rotary_dim / 2) in fp32 and are
// rounded once; the rest are copied. cs: the position's row of cos_sin_cache
// (cos in [0, rotary_dim / 2), sin after). out may alias x.
template <typename T>
void rope_row(T* out, const T* x, const float* cs, int64_t rotary_dim, int64_t d) {
  const int64_t half = rotary_dim / 2;
  const float* cos = cs;
  const float* sin = cs + half;
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = to_float(x[i]);
    const float x2 = to_float(x[i + half]);
    // Each product rounded to fp32 before the sum, as the eager reference does.
    const float a = x1 * cos[i], b = x2 * sin[i];
    const float c = x2 * cos[i], e = x1 * sin[i];
    out[i] = from_float<T>(a - b);
    out[i + half] = from_float<T>(c + e);
  }
  if (out != x)
    for (int64_t i = rotary_dim; i < d; ++i) out[i] = x[i];
}

// Symmetric quantization of a vector for a quantized pool: keys are divided
// by their smoothing factors first; per vector (`fixed` null) scale = amax /
// kMax rounded up to 4 (int8) or 7 (e4m3) significant bits (1 for a zero
// vector), per tensor scale = *fixed. Each element x / scale
// saturates to +-kMax: int8 rounded half-even to an integer, fp8 to the nearest
// e4m3 (c10's conversion rounds to nearest even; it gives NaN above 448, hence
// the clamp first). Returns the scale.
template <typename cache_t, typename T>
float quantize_row(cache_t* dst, const T* src, const float* smooth, const float* fixed, int64_t d,
                   std::vector<float>& buf) {
  constexpr bool kInt8 = std::is_same_v<cache_t, int8_t>;
  constexpr float kMax = kInt8 ? 127.f : 448.f;
  buf.resize(d);
  float amax = 0.f;
  for (int64_t i = 0; i < d; ++i) {
    buf[i] = smooth ? to_float(src[i]) / smooth[i] : to_float(src[i]);
    amax = std::max(amax, std::fabs(buf[i]));
  }
  float scale = fixed ? *fixed : amax > 0.f ? amax / kMax : 1.f;
  if (!fixed && amax > 0.f) {  // rounded up to kScaleBits significant bits (tileinfer/scale_rule.h)
    uint32_t bits;
    std::memcpy(&bits, &scale, 4);
    bits = kInt8 ? round_scale_bits_up<4>(bits) : round_scale_bits_up<7>(bits);
    std::memcpy(&scale, &bits, 4);
  }
  for (int64_t i = 0; i < d; ++i) {
    const float x = buf[i] / scale;
    if constexpr (kInt8) {
      const float r = std::nearbyint(x);  // default rounding mode: to nearest even
      dst[i] = static_cast<int8_t>(std::min(kMax, std::max(-kMax, r)));
    } else {
      dst[i] = static_cast<cache_t>(std::isnan(x) ? x : std::min(kMax, std::max(-kMax, x)));
    }
  }
  return scale;
}

// Writes one token's key and value vectors of one KV head at (page, slot).
template <typename T>
void write_kv_row(const HostKV& kv, void* k_cache, void* v_cache, float* k_scale, float* v_scale, int64_t page,
                  int64_t kv_head, int64_t slot, const T* k, const T* v, std::vector<float>& buf) {
  const int64_t d = kv.s.head_dim;
  const int64_t at = kv.vec(page, kv_head, slot);
  if (kv.s.quantized) {
    const float* smooth = kv.k_smooth ? kv.k_smooth + kv_head * d : nullptr;
    auto write = [&]<typename cache_t>() {
      const bool per_tensor = kv.s.scale_per_tensor;
      const float ks = quantize_row(static_cast<cache_t*>(k_cache) + at * d, k, smooth,
                                    per_tensor ? k_scale : nullptr, d, buf);
      const float vs = quantize_row(static_cast<cache_t*>(v_cache) + at * d, v, nullptr,
                                    per_tensor ? v_scale : nullptr, d, buf);
      if (!per_tensor) {
        k_scale[at] = ks;
        v_scale[at] = vs;
      }
    };
    if (kv.s.fp8) {
      write.template operator()<c10::Float8_e4m3fn>();
    } else {
      write.template operator()<int8_t>();
    }
  } else {
    std::copy(k, k + d, static_cast<T*>(k_cache) + at * d);
    std::copy(v, v + d, static_cast<T*>(v_cache) + at * d);
  }
}

// ---------------------------------------------------------------------------
// Checks.

// The position of every token of the step (-1 for tokens of no sequence), from
// host metadata already checked by check_metadata_values_on_host.
std::vector<int64_t> token_positions(const HostKV& kv, int64_t num_tokens, std::vector<int64_t>* seq_of) {
  std::vector<int64_t> pos(num_tokens, -1);
  if (seq_of) seq_of->assign(num_tokens, -1);
  for (int64_t seq = 0; seq < kv.s.num_seqs; ++seq) {
    const int64_t b = kv.cu_seqlens_q[seq], e = kv.cu_seqlens_q[seq + 1];
    for (int64_t t = b; t < e; ++t) {
      pos[t] = kv.seq_lens[seq] - (e - b) + (t - b);
      if (seq_of) (*seq_of)[t] = seq;
    }
  }
  return pos;
}

void check_positions_in_cache(const char* op, const std::vector<int64_t>& pos, int64_t max_position) {
  for (size_t t = 0; t < pos.size(); ++t)
    TILEINFER_CHECK(pos[t] < max_position, op, ": token ", t, " sits at position ", pos[t],
                ", beyond cos_sin_cache (max_position = ", max_position, ")");
}

// Writes every token's k / v into its page; tokens on pages outside the pool
// are skipped. Heads in parallel: a head's writes go to its own slots, and the
// tokens of a head are written in order (a repeated slot ends with the last).
template <typename T>
void write_tokens(const HostKV& kv, void* k_cache, void* v_cache, float* k_scale, float* v_scale,
                  const std::vector<int64_t>& pos, const std::vector<int64_t>& seq_of, const T* k, const T* v,
                  int64_t k_st, int64_t k_sh, int64_t v_st, int64_t v_sh) {
  at::parallel_for(0, kv.s.num_kv_heads, 1, [&](int64_t hb, int64_t he) {
    std::vector<float> buf;
    for (int64_t g = hb; g < he; ++g)
      for (size_t t = 0; t < pos.size(); ++t) {
        if (seq_of[t] < 0) continue;
        const int64_t page = kv.page_of(seq_of[t], pos[t] / kv.s.page_size);
        if (page < 0) continue;
        write_kv_row<T>(kv, k_cache, v_cache, k_scale, v_scale, page, g, pos[t] % kv.s.page_size,
                        k + t * k_st + g * k_sh, v + t * v_st + g * v_sh, buf);
      }
  });
}

}  // namespace

void rms_norm(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps) {
  const char* op = "rms_norm";
  check_rows_io(op, out, x);
  check_weight(op, "weight", weight, x.size(2), x.scalar_type(), x.device());
  const int64_t heads = x.size(1), d = x.size(2);
  TILEINFER_CPU_DISPATCH_FLOAT(x.scalar_type(), op, [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* w = weight.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, x.size(0) * heads, 64, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t t = r / heads, h = r % heads;
        rms_norm_row(o + t * out.stride(0) + h * out.stride(1), xp + t * x.stride(0) + h * x.stride(1), w, d,
                     static_cast<float>(eps));
      }
    });
  });
}

void rope(at::Tensor& out, const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_sin_cache,
          int64_t rotary_dim) {
  const char* op = "rope";
  check_rows_io(op, out, x);
  check_positions(op, positions, x);
  check_rotary(op, cos_sin_cache, rotary_dim, x.size(2), x.device());
  // Positions are on the host here: out-of-range ones are an error (free to check).
  const at::Tensor pos = positions.to(at::kLong).contiguous();
  const int64_t* pp = pos.data_ptr<int64_t>();
  const int64_t max_position = cos_sin_cache.size(0);
  for (int64_t t = 0; t < x.size(0); ++t)
    TILEINFER_CHECK(pp[t] >= 0 && pp[t] < max_position, op, ": positions[", t, "] = ", pp[t],
                " is outside [0, ", max_position, ") (the rows of cos_sin_cache)");
  const int64_t heads = x.size(1), d = x.size(2);
  const float* cs = cos_sin_cache.data_ptr<float>();
  TILEINFER_CPU_DISPATCH_FLOAT(x.scalar_type(), op, [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, x.size(0) * heads, 64, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t t = r / heads, h = r % heads;
        rope_row(o + t * out.stride(0) + h * out.stride(1), xp + t * x.stride(0) + h * x.stride(1),
                 cs + pp[t] * rotary_dim, rotary_dim, d);
      }
    });
  });
}

void cache_write(at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& k, const at::Tensor& v,
                 const at::Tensor& block_tables, const at::Tensor& seq_lens, const at::Tensor& cu_seqlens_q,
                 const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                 const std::optional<at::Tensor>& k_smooth) {
  const char* op = "cache_write";
  const PagedShape s =
      check_paged_cache(op, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_scale, v_scale, k_smooth);
  const at::ScalarType dtype = check_kv_inputs(op, s, k, v, k_cache);
  check_metadata_values_on_host(op, s, seq_lens, cu_seqlens_q, k.size(0), -1);
  const HostKV kv =
      detail::host_kv(s, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_scale, v_scale, k_smooth);
  std::vector<int64_t> seq_of;
  const std::vector<int64_t> pos = token_positions(kv, k.size(0), &seq_of);
  float* ks = s.quantized ? k_scale->data_ptr<float>() : nullptr;
  float* vs = s.quantized ? v_scale->data_ptr<float>() : nullptr;
  TILEINFER_CPU_DISPATCH_FLOAT(dtype, op, [&] {
    write_tokens<scalar_t>(kv, k_cache.data_ptr(), v_cache.data_ptr(), ks, vs, pos, seq_of,
                           k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(), k.stride(0), k.stride(1), v.stride(0),
                           v.stride(1));
  });
}

void attention_inputs(at::Tensor& q_out, at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& q,
                      const at::Tensor& k, const at::Tensor& v, const at::Tensor& block_tables,
                      const at::Tensor& seq_lens, const at::Tensor& cu_seqlens_q, const at::Tensor& cos_sin_cache,
                      int64_t rotary_dim, const std::optional<at::Tensor>& q_norm_weight,
                      const std::optional<at::Tensor>& k_norm_weight, double eps,
                      const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                      const std::optional<at::Tensor>& k_smooth, const std::optional<at::Tensor>& positions) {
  const char* op = "attention_inputs";
  const InputsShape in = check_attention_inputs(op, q_out, k_cache, v_cache, q, k, v, block_tables, seq_lens,
                                                cu_seqlens_q, cos_sin_cache, rotary_dim, q_norm_weight,
                                                k_norm_weight, k_scale, v_scale, k_smooth, positions);
  const PagedShape& s = in.cache;
  const at::ScalarType dtype = in.dtype;
  const int64_t d = s.head_dim;
  check_metadata_values_on_host(op, s, seq_lens, cu_seqlens_q, q.size(0), -1);
  const HostKV kv =
      detail::host_kv(s, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_scale, v_scale, k_smooth);
  std::vector<int64_t> seq_of;
  const std::vector<int64_t> pos = token_positions(kv, q.size(0), &seq_of);
  // RoPE at the explicit positions when given (tree verify: depths), else at
  // the slot positions; the cache slots are pos either way.
  std::vector<int64_t> rot = pos;
  if (positions.has_value()) {
    const at::Tensor given = positions->to(at::kLong).contiguous();
    const int64_t* gp = given.data_ptr<int64_t>();
    for (int64_t t = 0; t < q.size(0); ++t) {
      if (seq_of[t] < 0) continue;  // a token of no sequence is skipped, whatever its position
      TILEINFER_CHECK(gp[t] >= 0, op, ": positions[", t, "] = ", gp[t], " is negative");
      rot[t] = gp[t];
    }
  }
  check_positions_in_cache(op, rot, cos_sin_cache.size(0));
  const float* cs = cos_sin_cache.data_ptr<float>();
  const float feps = static_cast<float>(eps);
  const int64_t num_tokens = q.size(0), hkv = s.num_kv_heads;

  TILEINFER_CPU_DISPATCH_FLOAT(dtype, op, [&] {
    const scalar_t* qw = q_norm_weight.has_value() ? q_norm_weight->data_ptr<scalar_t>() : nullptr;
    const scalar_t* kw = k_norm_weight.has_value() ? k_norm_weight->data_ptr<scalar_t>() : nullptr;
    // Each head of x [num_tokens, heads, d] of a token in a sequence: norm
    // (rounded to the element type, as the rms_norm op's output is) when w is
    // given, then rotation into dst(t, h). Tokens of no sequence are skipped.
    auto norm_rope = [&](const at::Tensor& x, const scalar_t* w, auto dst) {
      const int64_t heads = x.size(1);
      const scalar_t* xp = x.data_ptr<scalar_t>();
      at::parallel_for(0, num_tokens * heads, 64, [&](int64_t b, int64_t e) {
        std::vector<scalar_t> tmp(d);
        for (int64_t r = b; r < e; ++r) {
          const int64_t t = r / heads, h = r % heads;
          if (seq_of[t] < 0) continue;
          const scalar_t* src = xp + t * x.stride(0) + h * x.stride(1);
          if (w) {
            rms_norm_row(tmp.data(), src, w, d, feps);
            src = tmp.data();
          }
          rope_row(dst(t, h), src, cs + rot[t] * rotary_dim, rotary_dim, d);
        }
      });
    };
    scalar_t* qo = q_out.data_ptr<scalar_t>();
    norm_rope(q, qw, [&](int64_t t, int64_t h) { return qo + t * q_out.stride(0) + h * q_out.stride(1); });
    // Keys: the same, then into the cache with the values, exactly as
    // rms_norm + rope + cache_write would (same helpers, same roundings).
    // Rotated keys are staged in a [num_tokens, num_kv_heads, head_dim] buffer.
    std::vector<scalar_t> k_rot(static_cast<size_t>(num_tokens * hkv * d));
    norm_rope(k, kw, [&](int64_t t, int64_t g) { return k_rot.data() + (t * hkv + g) * d; });
    write_tokens<scalar_t>(kv, k_cache.data_ptr(), v_cache.data_ptr(),
                           s.quantized ? k_scale->data_ptr<float>() : nullptr,
                           s.quantized ? v_scale->data_ptr<float>() : nullptr, pos, seq_of, k_rot.data(),
                           v.data_ptr<scalar_t>(), hkv * d, d, v.stride(0), v.stride(1));
  });
}

}  // namespace tileinfer::cpu

TORCH_LIBRARY_IMPL(tileinfer_attn, CPU, m) {
  m.impl("rms_norm", &tileinfer::cpu::rms_norm);
  m.impl("rope", &tileinfer::cpu::rope);
  m.impl("cache_write", &tileinfer::cpu::cache_write);
  m.impl("attention_inputs", &tileinfer::cpu::attention_inputs);
}
