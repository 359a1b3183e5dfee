// Host side of the bulk tensor copies: tensor maps (CUtensorMap) for the
// Hopper prefill kernel, encoded through the driver entry point that the runtime
// hands out (no link against libcuda).
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "tileinfer/error.h"

namespace tileinfer::cuda {

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000,
                                                             cudaEnableDefault, &status);
    TILEINFER_CHECK(err == cudaSuccess && status == cudaDriverEntryPointSuccess && ptr != nullptr,
                    "cuTensorMapEncodeTiled is not available from the CUDA driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

// A map of a tensor of `rank` dims (innermost first: sizes in elements,
// strides in bytes of dims 1..rank-1), copied in boxes of `box` elements:
// into the 128-byte-swizzle layout of the wgmma operands (16-bit elements,
// box[0] * 2 == 128), or dense (CU_TENSOR_MAP_SWIZZLE_NONE: box[0] times the
// element size a multiple of 16 bytes). Boxes outside the tensor are filled
// with zeros.
template <int kRank>
CUtensorMap make_tensor_map(const void* base, CUtensorMapDataType type, const uint64_t (&sizes)[kRank],
                            const uint64_t (&strides)[kRank - 1], const uint32_t (&box)[kRank],
                            CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  CUtensorMap map{};
  uint32_t elem_strides[kRank];
  for (int i = 0; i < kRank; ++i) elem_strides[i] = 1;
  const CUresult res = tensor_map_encoder()(
      &map, type, kRank, const_cast<void*>(base), sizes, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TILEINFER_CHECK(res == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (error ", static_cast<int>(res), ")");
  return map;
}

}  // namespace tileinfer::cuda
