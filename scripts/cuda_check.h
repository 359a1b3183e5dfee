// For the stand-alone GPU scripts (wgmma_selftest.cu, decode_timeline.cu,
// inputs_variants.cu). CHECK(call): a CUDA runtime call; on an error, prints
// it with the call and its place, and exits 1. time_us: a timing loop.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define CHECK(x)                                                                     \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

// Mean time of one call of `launch` (work queued on the default stream) over
// `iters` calls after `warmup` more, by CUDA events, in us.
template <class Launch>
double time_us(Launch&& launch, int iters, int warmup = 5) {
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < warmup; ++i) launch();
  CHECK(cudaEventRecord(e0));
  for (int i = 0; i < iters; ++i) launch();
  CHECK(cudaEventRecord(e1));
  CHECK(cudaEventSynchronize(e1));
  float ms;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  return 1e3 * ms / iters;
}
