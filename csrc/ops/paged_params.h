// PagedKVParams from the tensors of a checked paged cache (check_paged_cache):
// shared by the attention and the inputs launchers.
#pragma once

#include <cstdint>
#include <optional>

#include <ATen/ATen.h>

#include "checks.h"
#include "tileinfer/params.h"

namespace tileinfer::cuda {

inline PagedKVParams paged_params(const PagedShape& s, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                  const at::Tensor& cu_seqlens_q, const std::optional<at::Tensor>& k_scale,
                                  const std::optional<at::Tensor>& v_scale,
                                  const std::optional<at::Tensor>& k_smooth) {
  PagedKVParams p{};
  p.k_cache = k_cache.data_ptr();
  p.v_cache = v_cache.data_ptr();
  p.k_scale = s.quantized ? k_scale->data_ptr<float>() : nullptr;
  p.v_scale = s.quantized ? v_scale->data_ptr<float>() : nullptr;
  p.k_smooth = s.quantized && k_smooth.has_value() ? k_smooth->data_ptr<float>() : nullptr;
  p.block_tables = block_tables.data_ptr<int32_t>();
  p.seq_lens = seq_lens.data_ptr<int32_t>();
  p.cu_seqlens_q = cu_seqlens_q.data_ptr<int32_t>();
  p.num_seqs = static_cast<int>(s.num_seqs);
  p.max_pages = static_cast<int>(s.max_pages);
  p.num_pages = static_cast<int>(s.num_pages);
  p.num_kv_heads = static_cast<int>(s.num_kv_heads);
  p.page_size = static_cast<int>(s.page_size);
  p.head_dim = static_cast<int>(s.head_dim);
  p.scale_per_tensor = s.scale_per_tensor;
  return p;
}

}  // namespace tileinfer::cuda
