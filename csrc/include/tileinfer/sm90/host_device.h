// TILEINFER_HD: functions of the Hopper prefill kernel's headers that the
// host (and the CPU tests, through a plain C++ compiler) runs too.
#pragma once

#if defined(__CUDACC__)
#define TILEINFER_HD __host__ __device__ __forceinline__
#else
#define TILEINFER_HD inline
#endif
