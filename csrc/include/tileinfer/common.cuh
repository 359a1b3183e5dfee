// Small device helpers shared by every kernel. No torch headers here: kernels
// stay plain CUDA so they can be read (and reused) without PyTorch.
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace tileinfer {

template <typename T>
__host__ __device__ constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

// log2(e): scores are scaled by scale * log2(e) once, so the softmax can use exp2.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Element conversions. Every kernel goes through these so that rounding is the
// same everywhere (round-to-nearest-even, as PyTorch's casts).
template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <> __device__ __forceinline__ float to_float<int8_t>(int8_t x) { return static_cast<float>(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Two adjacent elements of T as one value: a b32 register of two 16-bit
// elements (`lo` = .x in the low half: the element order of the mma fragments,
// mma.cuh, and of memory), float2 for fp32. ElemPair<T>: unpack (to floats),
// round (two floats to a pair, to nearest even, one cvt for 16-bit types), mul:
// the product of two pairs rounded to T, as the fp32 product rounded to T
// (eager PyTorch's `a * b` of two tensors of T). For bf16 / fp16 that is
// __hmul2_rn, which rounds the exact product once: the same bits for every one
// of the 2^32 pairs of values of either type (NaN as NaN), as
// scripts/inputs_variants.cu checks on a GPU.
template <typename T>
struct ElemPair;
template <>
struct ElemPair<float> {
  using P = float2;
  __device__ static __forceinline__ float2 unpack(P p) { return p; }
  __device__ static __forceinline__ P round(float a, float b) { return make_float2(a, b); }
  __device__ static __forceinline__ P mul(P a, P b) { return make_float2(__fmul_rn(a.x, b.x), __fmul_rn(a.y, b.y)); }
};
template <>
struct ElemPair<__nv_bfloat16> {
  using P = __nv_bfloat162;
  __device__ static __forceinline__ float2 unpack(P p) { return __bfloat1622float2(p); }
  __device__ static __forceinline__ P round(float a, float b) { return __floats2bfloat162_rn(a, b); }
  __device__ static __forceinline__ P mul(P a, P b) { return __hmul2_rn(a, b); }
};
template <>
struct ElemPair<__half> {
  using P = __half2;
  __device__ static __forceinline__ float2 unpack(P p) { return __half22float2(p); }
  __device__ static __forceinline__ P round(float a, float b) { return __floats2half2_rn(a, b); }
  __device__ static __forceinline__ P mul(P a, P b) { return __hmul2_rn(a, b); }
};
template <typename T>
using Pair = typename ElemPair<T>::P;

// Two floats rounded into one b32 register of a 16-bit type (ElemPair::round), as bits.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  static_assert(sizeof(Pair<T>) == 4, "pack2 is for 16-bit element types");
  const Pair<T> v = ElemPair<T>::round(lo, hi);
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}

// Warp-wide reductions over all 32 lanes (or over groups of `Width` lanes).
template <int Width = 32>
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = Width / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o, Width);
  return x;
}
template <int Width = 32>
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = Width / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o, Width));
  return x;
}

// Programmatic dependent launch (sm_90 on; no-ops before): a kernel that lets
// the next one start early calls allow_dependent_launch; the dependent kernel
// calls wait_for_prior_grids before its first read of what the previous grid
// wrote (it returns once that grid has finished and its writes are visible;
// at once when the kernel was launched the ordinary way).
//
// Every kernel of this package waits first thing, allows the next one to
// start (the attention kernels at their epilogue, the small ones at once but
// the quantized prefill's own-keys pass before its kernel, at its end),
// and is launched with launch_kernel(..., programmatic = true): its blocks are
// scheduled while the previous kernel of the stream still runs (when that one
// allowed it) and wait there before any read or write. Waiting first keeps
// the order of plain launches: nothing is read before its producer is done,
// nothing written before the previous kernel's reads are, and since every
// kernel waits before it ends, one that finished implies all the kernels
// before it did too. Three exceptions: attention_inputs' keys / values kernel,
// behind its queries kernel (which allows it only after its own wait), waits
// at its end instead (inputs.cuh); the quantized prefill's own-keys pass,
// behind the scale-range pass (which also allows it only after its own
// wait), waits after its first row's loads (prefill_own_kv.cuh); the
// bf16 / fp16 decode kernel reads the
// step's metadata and first block-table entries before its wait and, when
// launched programmatically, again after it, starting over if they changed
// (attention_kernel.cuh).
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Block timeline for a measuring build (off unless TILEINFER_TIMELINE is
// defined; one translation unit): thread 0 of each block records the
// global timer at stamp i (slots 0-7 of its 16) and, at stamp 0, its SM (slot 8).
#ifdef TILEINFER_TIMELINE
__device__ unsigned long long tileinfer_timeline[1 << 20];
__device__ __forceinline__ void timeline_stamp(int i) {
  if (threadIdx.x != 0) return;
  unsigned long long* slots = tileinfer_timeline + ((blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * 16;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  slots[i] = t;
  if (i == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    slots[8] = sm;
  }
}
#define TILEINFER_STAMP(i) timeline_stamp(i)
#else
#define TILEINFER_STAMP(i) \
  do {                     \
  } while (0)
#endif

// Launches kernel<<<grid, block, smem, stream>>>(args...), as a programmatic
// dependent launch when `programmatic` (see above; the caller checks sm_90),
// at a scheduling priority other than the stream's when `priority` is not 0
// (lower numbers first: the block scheduler places a pending block of a
// higher-priority grid first wherever one fits), and in thread-block
// clusters of `cluster_x` blocks along x when that is above 1 (sm_90; grid.x
// a multiple of it). Works in captured CUDA graphs: the dependency becomes a
// programmatic edge, the priority the node's, which a graph applies only
// when instantiated to (PyTorch's graphs are not).
template <typename... Params, typename... Args>
cudaError_t launch_kernel_ex(int priority, unsigned cluster_x, void (*kernel)(Params...), dim3 grid, dim3 block,
                             size_t smem, cudaStream_t stream, bool programmatic, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attrs[3]{};
  config.attrs = attrs;
  if (programmatic) {
    attrs[config.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[config.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (priority != 0) {
    attrs[config.numAttrs].id = cudaLaunchAttributePriority;
    attrs[config.numAttrs++].val.priority = priority;
  }
  if (cluster_x > 1) {
    attrs[config.numAttrs].id = cudaLaunchAttributeClusterDimension;
    attrs[config.numAttrs].val.clusterDim.x = cluster_x;
    attrs[config.numAttrs].val.clusterDim.y = 1;
    attrs[config.numAttrs++].val.clusterDim.z = 1;
  }
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                          bool programmatic, Args&&... args) {
  return launch_kernel_ex(0, 1, kernel, grid, block, smem, stream, programmatic, std::forward<Args>(args)...);
}

// 16-byte vector of elements: the unit of every global load/store in the kernels.
template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

}  // namespace tileinfer
