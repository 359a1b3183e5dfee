// A CUDA device attribute read once per device and process: the ops consult
// some on every eager call (a driver query each time would cost microseconds).
// Not through ATen/cuda/CUDAContext.h's device properties: that header pulls
// in cuBLAS/cuSPARSE headers that a plain CUDA toolkit install may lack.
#pragma once

#include <array>
#include <atomic>

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>

namespace tileinfer {

// 0 for device indices outside [0, 64) (never cached, never queried).
template <cudaDeviceAttr kAttr>
int cached_device_attribute(int device) {
  static std::array<std::atomic<int>, 64> values{};  // 0: not read yet (the attributes used are positive)
  if (device < 0 || device >= 64) return 0;
  int value = values[device].load(std::memory_order_relaxed);
  if (value == 0) {
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&value, kAttr, device));
    values[device].store(value, std::memory_order_relaxed);
  }
  return value;
}

// Whether the ops launch their kernels as programmatic dependent launches
// (tileinfer/common.cuh): always, on compute capability 9.0 and later, where
// a kernel's start-up overlaps the previous kernel's tail.
inline bool programmatic_launch(int device) {
  return cached_device_attribute<cudaDevAttrComputeCapabilityMajor>(device) >= 9;
}

}  // namespace tileinfer
