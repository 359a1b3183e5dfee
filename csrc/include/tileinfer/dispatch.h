// The one place where runtime values become template arguments. Each switch
// calls a lambda with a compile-time constant in scope, so switches nest cleanly
// and launchers keep their commas out of macros. Only the values of the support
// table (tile_table.h) are instantiated, and an unsupported value's error lists
// that table's values.
#pragma once

#include "error.h"
#include "tile_table.h"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cstdint>

#include <c10/util/Exception.h>
#include <c10/core/ScalarType.h>

// One case of a dtype switch: `ALIAS` names the C++ type of the dtype in the
// lambda's scope.
#define TILEINFER_TYPE_CASE_(dtype, type, ALIAS, ...) \
  case at::ScalarType::dtype: {                     \
    using ALIAS = type;                             \
    return __VA_ARGS__();                           \
  }
#define TILEINFER_UNSUPPORTED_DTYPE_(stype, NAME, what, table)                   \
  TILEINFER_CHECK(false, NAME, ": unsupported ", what, " ", stype, " (expected ", \
                  ::tileinfer::expected(::tileinfer::table), ")")

// Element types of q / out / a non-int8 cache (tile_table.h: kFloatDtypes).
#define TILEINFER_DISPATCH_FLOAT(stype, NAME, ...)                          \
  [&] {                                                                    \
    switch (stype) {                                                       \
      TILEINFER_TYPE_CASE_(BFloat16, __nv_bfloat16, scalar_t, __VA_ARGS__) \
      TILEINFER_TYPE_CASE_(Half, __half, scalar_t, __VA_ARGS__)            \
      TILEINFER_TYPE_CASE_(Float, float, scalar_t, __VA_ARGS__)            \
      default:                                                             \
        TILEINFER_UNSUPPORTED_DTYPE_(stype, NAME, "dtype", kFloatDtypes);  \
    }                                                                      \
  }()

// Same, without fp32 (tile_table.h: kHalfDtypes): for tensor-core kernels whose
// fp32 path is separate.
#define TILEINFER_DISPATCH_HALF(stype, NAME, ...)                           \
  [&] {                                                                    \
    switch (stype) {                                                       \
      TILEINFER_TYPE_CASE_(BFloat16, __nv_bfloat16, scalar_t, __VA_ARGS__) \
      TILEINFER_TYPE_CASE_(Half, __half, scalar_t, __VA_ARGS__)            \
      default:                                                             \
        TILEINFER_UNSUPPORTED_DTYPE_(stype, NAME, "dtype", kHalfDtypes);   \
    }                                                                      \
  }()

// Quantized cache types (tile_table.h: kQuantDtypes), with `cache_t` in scope:
// the CacheT of the tile kernels and the cache writes (quant.cuh).
#define TILEINFER_DISPATCH_QUANT(stype, NAME, ...)                                         \
  [&] {                                                                                   \
    switch (stype) {                                                                      \
      TILEINFER_TYPE_CASE_(Char, int8_t, cache_t, __VA_ARGS__)                            \
      TILEINFER_TYPE_CASE_(Float8_e4m3fn, __nv_fp8_e4m3, cache_t, __VA_ARGS__)            \
      default:                                                                            \
        TILEINFER_UNSUPPORTED_DTYPE_(stype, NAME, "quantized cache dtype", kQuantDtypes); \
    }                                                                                     \
  }()

// Head dims of the support table (tile_table.h: TILEINFER_HEAD_DIMS), one case
// each, with `constexpr int HEAD_DIM` in scope of the lambda: the row kernels
// of the attention inputs, instantiated per head dim.
#define TILEINFER_HEAD_DIM_CASE_(v, ...)                                             \
  case v: {                                                                         \
    constexpr int HEAD_DIM = v;                                                     \
    return __VA_ARGS__();                                                           \
  }
#define TILEINFER_UNSUPPORTED_HEAD_DIM_(d, NAME)                                     \
  TILEINFER_CHECK(false, NAME, ": unsupported head_dim ", d, " (expected ",         \
                  ::tileinfer::expected(::tileinfer::kHeadDims), ")")
#define TILEINFER_DISPATCH_HEAD_DIM(d, NAME, ...)                                    \
  [&] {                                                                             \
    switch (d) {                                                                    \
      TILEINFER_HEAD_DIMS(TILEINFER_HEAD_DIM_CASE_, __VA_ARGS__)                    \
      default:                                                                      \
        TILEINFER_UNSUPPORTED_HEAD_DIM_(d, NAME);                                   \
    }                                                                               \
  }()

// The attention kernels' tile dim of head dim d (tile_table.h: tile_head_dim),
// with `constexpr int TILE_DIM` in scope of the lambda; the kernels read the
// head dim itself from their params (kv.head_dim).
#define TILEINFER_TILE_DIM_CASE_(v, ...)                                             \
  case v: {                                                                         \
    constexpr int TILE_DIM = v;                                                     \
    return __VA_ARGS__();                                                           \
  }
#define TILEINFER_DISPATCH_TILE_DIM(d, NAME, ...)                                    \
  [&] {                                                                             \
    if (!::tileinfer::supported_head_dim(d)) TILEINFER_UNSUPPORTED_HEAD_DIM_(d, NAME); \
    switch (::tileinfer::tile_head_dim(d)) {                                        \
      TILEINFER_TILE_HEAD_DIMS(TILEINFER_TILE_DIM_CASE_, __VA_ARGS__)               \
      default:                                                                      \
        TILEINFER_UNSUPPORTED_HEAD_DIM_(d, NAME);                                   \
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
