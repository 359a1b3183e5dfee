// The one place where runtime values become template arguments. Each switch
// calls a lambda with a compile-time constant in scope, so switches nest cleanly
// and launchers keep their commas out of macros. Only values listed here are
// instantiated: adding a head dim or page size is a one-line change here.
#pragma once

#include "error.h"
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <c10/util/Exception.h>
#include <c10/core/ScalarType.h>

// Element types of q / out / a non-int8 cache.
#define TILEINFER_DISPATCH_FLOAT(stype, NAME, ...)                                   \
  [&] {                                                                             \
    switch (stype) {                                                                \
      case at::ScalarType::BFloat16: {                                              \
        using scalar_t = __nv_bfloat16;                                             \
        return __VA_ARGS__();                                                       \
      }                                                                             \
      case at::ScalarType::Half: {                                                  \
        using scalar_t = __half;                                                    \
        return __VA_ARGS__();                                                       \
      }                                                                             \
      case at::ScalarType::Float: {                                                 \
        using scalar_t = float;                                                     \
        return __VA_ARGS__();                                                       \
      }                                                                             \
      default:                                                                      \
        TILEINFER_CHECK(false, NAME, ": unsupported dtype ", stype,                     \
                    " (expected bfloat16, float16 or float32)");                    \
    }                                                                               \
  }()

// Same, without fp32: for tensor-core kernels whose fp32 path is separate.
#define TILEINFER_DISPATCH_HALF(stype, NAME, ...)                                    \
  [&] {                                                                             \
    switch (stype) {                                                                \
      case at::ScalarType::BFloat16: {                                              \
        using scalar_t = __nv_bfloat16;                                             \
        return __VA_ARGS__();                                                       \
      }                                                                             \
      case at::ScalarType::Half: {                                                  \
        using scalar_t = __half;                                                    \
        return __VA_ARGS__();                                                       \
      }                                                                             \
      default:                                                                      \
        TILEINFER_CHECK(false, NAME, ": unsupported dtype ", stype,                     \
                    " (expected bfloat16 or float16)");                             \
    }                                                                               \
  }()

// Head dims of SPEC section 1.
#define TILEINFER_DISPATCH_HEAD_DIM(d, NAME, ...)                                    \
  [&] {                                                                             \
    switch (d) {                                                                    \
      case 64: { constexpr int HEAD_DIM = 64; return __VA_ARGS__(); }               \
      case 128: { constexpr int HEAD_DIM = 128; return __VA_ARGS__(); }             \
      case 256: { constexpr int HEAD_DIM = 256; return __VA_ARGS__(); }             \
      default:                                                                      \
        TILEINFER_CHECK(false, NAME, ": unsupported head_dim ", d,                      \
                    " (expected 64, 128 or 256)");                                  \
    }                                                                               \
  }()

// Page sizes of SPEC section 1. Kernels that do not need the page size at
// compile time (they walk positions, not pages) take it as a runtime value.
#define TILEINFER_DISPATCH_PAGE_SIZE(p, NAME, ...)                                   \
  [&] {                                                                             \
    switch (p) {                                                                    \
      case 16: { constexpr int PAGE_SIZE = 16; return __VA_ARGS__(); }              \
      case 32: { constexpr int PAGE_SIZE = 32; return __VA_ARGS__(); }              \
      case 64: { constexpr int PAGE_SIZE = 64; return __VA_ARGS__(); }              \
      case 128: { constexpr int PAGE_SIZE = 128; return __VA_ARGS__(); }            \
      default:                                                                      \
        TILEINFER_CHECK(false, NAME, ": unsupported page_size ", p,                     \
                    " (expected 16, 32, 64 or 128)");                               \
    }                                                                               \
  }()

#define TILEINFER_BOOL_SWITCH(cond, CONST_NAME, ...)                                 \
  [&] {                                                                             \
    if (cond) {                                                                     \
      constexpr bool CONST_NAME = true;                                             \
      return __VA_ARGS__();                                                         \
    } else {                                                                        \
      constexpr bool CONST_NAME = false;                                            \
      return __VA_ARGS__();                                                         \
    }                                                                               \
  }()
