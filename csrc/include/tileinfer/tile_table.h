// What the extension supports, answered in one place: head dims, page sizes,
// element types, and the decode kernel's tile shapes per head dim. The dispatch
// switches (dispatch.h), the host checks and their messages (csrc/checks.cpp),
// the CPU ops and the op `supported` (which hands these lists to Python, where
// tileinfer_attn/cache.py reads them) all read this file; nothing else lists them.
//
// Adding a head dim: add it to TILEINFER_HEAD_DIMS (a multiple of 16 that a
// tile dim holds runs on that tile's kernels), or, for a new tile dim, to
// TILEINFER_TILE_HEAD_DIMS and tile_head_dim as well: every attention kernel
// that the dispatch reaches is then instantiated for it (the dispatch switches
// are the instantiation list); check the tile shapes below (shared memory per
// stage grows with the head dim) and the kernels' static_asserts.
//
// Host-side C++ only (c10's ScalarType, no CUDA), so the CPU-only build uses it too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <c10/core/ScalarType.h>

// Head dims, as X-macros: X(v, args...) is expanded once per head dim; the
// extra arguments let a dispatch switch pass its lambda to every case.
//   TILEINFER_HEAD_DIMS: the head dims the ops take (kHeadDims below), each
//     instantiated as it is by the row kernels of the attention inputs
//     (TILEINFER_DISPATCH_HEAD_DIM, dispatch.h).
//   TILEINFER_TILE_HEAD_DIMS: the head dims the attention kernels are built
//     for (TILEINFER_DISPATCH_TILE_DIM). A head dim runs on the smallest tile
//     dim that holds it (tile_head_dim): 80 and 96 on 128's kernels, whose
//     tiles in shared memory and registers get zeros past the head dim (the
//     copies read only the row's own bytes and zero-fill the rest, or at d 96
//     leave the rest to zeros written once per work item, tile_io.cuh; the
//     stores write only its columns). Zero columns add nothing to a score,
//     and the output columns past the head dim are never stored. That costs
//     tensor-core time (128 / 80 of d 80's products) but no new
//     instantiation of any attention kernel: a native d 80 tile would need
//     rows that are not whole 128-byte swizzle blocks.
#define TILEINFER_HEAD_DIMS(X, ...) \
  X(64, __VA_ARGS__) X(80, __VA_ARGS__) X(96, __VA_ARGS__) X(128, __VA_ARGS__) X(256, __VA_ARGS__)
#define TILEINFER_TILE_HEAD_DIMS(X, ...) X(64, __VA_ARGS__) X(128, __VA_ARGS__) X(256, __VA_ARGS__)

namespace tileinfer {

#define TILEINFER_TABLE_ENTRY(v, ...) v,
inline constexpr int64_t kHeadDims[] = {TILEINFER_HEAD_DIMS(TILEINFER_TABLE_ENTRY, )};
#undef TILEINFER_TABLE_ENTRY
// The attention kernels' head dim (tile dim) that runs head dim d (one of kHeadDims).
constexpr int64_t tile_head_dim(int64_t d) { return d <= 64 ? 64 : d <= 128 ? 128 : 256; }
// Page sizes (positions per page). A run-time value in every kernel; powers of
// two, because the kernels find a position's page and slot with a shift and a mask.
inline constexpr int64_t kPageSizes[] = {16, 32, 64, 128};

// Element types of q, out and a non-int8 cache (fp32 runs on the CUDA cores).
inline constexpr c10::ScalarType kFloatDtypes[] = {c10::ScalarType::BFloat16, c10::ScalarType::Half,
                                                   c10::ScalarType::Float};
// Element types of the cache: the float types, or a quantized type with fp32
// scales (kQuantDtypes).
inline constexpr c10::ScalarType kCacheDtypes[] = {c10::ScalarType::BFloat16, c10::ScalarType::Half,
                                                   c10::ScalarType::Float, c10::ScalarType::Char,
                                                   c10::ScalarType::Float8_e4m3fn};
// Quantized cache types: int8 (scales per vector) and float8 e4m3 (scales per
// vector or per tensor). The kernels read them as the element type of a
// TileConfig's CacheT (dispatch.h: TILEINFER_DISPATCH_QUANT).
inline constexpr c10::ScalarType kQuantDtypes[] = {c10::ScalarType::Char, c10::ScalarType::Float8_e4m3fn};
// The 16-bit float types: the tensor cores' inputs (queries over a quantized
// cache, keys and values written into one).
inline constexpr c10::ScalarType kHalfDtypes[] = {c10::ScalarType::BFloat16, c10::ScalarType::Half};

template <typename T, size_t N>
constexpr bool table_has(const T (&list)[N], T v) {
  for (size_t i = 0; i < N; ++i)
    if (list[i] == v) return true;
  return false;
}
constexpr bool supported_head_dim(int64_t d) { return table_has(kHeadDims, d); }
constexpr bool supported_page_size(int64_t p) { return table_has(kPageSizes, p); }
constexpr bool float_dtype(c10::ScalarType t) { return table_has(kFloatDtypes, t); }
constexpr bool cache_dtype(c10::ScalarType t) { return table_has(kCacheDtypes, t); }
constexpr bool half_dtype(c10::ScalarType t) { return table_has(kHalfDtypes, t); }
constexpr bool quant_dtype(c10::ScalarType t) { return table_has(kQuantDtypes, t); }

// The largest magnitude a quantized element holds: a per-vector scale is
// amax / this, and writes saturate to +-this.
constexpr float quant_max(c10::ScalarType t) { return t == c10::ScalarType::Char ? 127.f : 448.f; }

// A dtype's name as Python spells it (torch.<name>).
inline const char* dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Char: return "int8";
    case c10::ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case c10::ScalarType::Float8_e5m2: return "float8_e5m2";
    default: return c10::toString(t);
  }
}

// A list for error messages: "64, 128 or 256", "bfloat16, float16 or float32".
inline std::string table_text(int64_t v) { return std::to_string(v); }
inline std::string table_text(c10::ScalarType t) { return dtype_name(t); }
template <typename T, size_t N>
std::string expected(const T (&list)[N]) {
  std::string s;
  for (size_t i = 0; i < N; ++i) {
    if (i) s += i + 1 == N ? " or " : ", ";
    s += table_text(list[i]);
  }
  return s;
}

// ---- tile shapes (TileConfig's parameters, tile_config.cuh)

struct TileShape {
  int warps_m;    // warps over query rows
  int warps_n;    // warps over the keys of a tile (key slices, merged at the end)
  int row_tiles;  // 16-row mma tiles per warp
  int block_n;    // keys per tile
  int stages;     // tiles of copies in flight (cp.async)
};

// Decode, up to 16 packed rows (group x queries: plain decode of any group <= 16,
// or a few verify queries), or up to 32 with a block per 16 rows (MQA's 32
// heads: csrc/ops/decode.cu): one 16-row tile, the 4 warps split each 64-key tile
// into 16-key slices. Decode is a stream over the cache, so three stages keep
// two tiles of copies in flight per block (d = 128: 100 KB, two blocks per SM);
// d = 256 keeps two stages (one block per SM, 138 KB; three would not fit). An
// int8 cache's stages are half the bytes: three blocks share an SM at d <= 128
// (~56 KB each at d 128).
constexpr TileShape decode_tile_small(int64_t d) { return {1, 4, 1, 64, d >= 256 ? 2 : 3}; }

// Decode over a quantized (int8 or fp8) cache when the launch's blocks fit two per SM anyway:
// 128-key tiles, so each warp converts and multiplies 32 keys per barrier, per
// softmax step and per scale load instead of 16, in a loop bound by
// instructions (on the H200 about 9% faster for one sequence at 32k positions
// and for 32 sequences at 4k). Three stages, two blocks per SM; a launch of
// more blocks takes the small tile (three per SM), and short splits lose with
// it (half of a 128-key tile is empty when a split holds one 64-key page). For d <= 128.
constexpr TileShape decode_tile_quant_wide(int64_t) { return {1, 4, 1, 128, 3}; }

// Decode of more than 32 packed rows (verify steps with large groups): 64-row
// tiles as prefill's; the grid adds a row-tile dimension and row tiles share the
// pages through L2. d = 256 halves the key tile to keep two stages in shared memory.
constexpr TileShape decode_tile_large(int64_t d) { return {4, 1, 1, d >= 256 ? 32 : 64, 2}; }

}  // namespace tileinfer
