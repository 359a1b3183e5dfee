// The test kernel of test_programmatic_launch_gpu.py, built there with
// nvcc -shared and called through ctypes. Plain CUDA, no torch headers: it
// builds in a few seconds. (As a torch extension built with load_inline it
// took over a minute with the other test workers busy, every worker of the
// module waited on the build's shared lock, and a lock left by a worker
// stopped mid-build makes them wait for good.)
#include <cuda_runtime.h>

// Lets the next kernel start, waits delay_ns, then copies src to dst (int32).
__global__ void late_copy_kernel(int* dst, const int* src, int n, long long delay_ns) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < delay_ns);
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

extern "C" int late_copy(int* dst, const int* src, int n, long long delay_ns, void* stream) {
  late_copy_kernel<<<1, 128, 0, static_cast<cudaStream_t>(stream)>>>(dst, src, n, delay_ns);
  return static_cast<int>(cudaGetLastError());
}
