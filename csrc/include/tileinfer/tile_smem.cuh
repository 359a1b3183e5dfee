// Shared memory of the tile kernel (attention_kernel.cuh), carved from the
// block's dynamic allocation in one place; the sizes are TileConfig's
// (tile_config.cuh). The K / V stages and the epilogue's fp32 rows share the
// first region: the epilogue starts once the last tile's products are done.
#pragma once

#include <cstdint>

#include "tile_config.cuh"
#include "tile_io.cuh"

namespace tileinfer {

template <class Cfg>
struct TileSmem {
  using T = typename Cfg::T;
  static constexpr int BM = Cfg::kBlockM;
  static constexpr int BN = Cfg::kBlockN;
  static constexpr int kFlags = KeyTiles<BN, Cfg::kStages, Cfg::kRowSlots>::kFlags;

  uint8_t* kv;         // [S][K, V][BN rows] swizzled
  T* conv;             // int8 prefill: [BN * D] values, swizzled
  float* o;            // epilogue: [kWarpsN][BM][kOStride]
  T* q;                // [BM * D] swizzled (int8: [hi, lo][BM * D] bytes)
  int* key_rows;       // [kRowSlots][BN]
  int* flags;          // [kRowSlots][kFlags]
  int* row_token;      // [BM] token of each row, -1: padding
  int* row_head;       // [BM] query head of each row
  int* row_qpos;       // [BM] position of each row's query
  uint32_t* row_tree;  // [BM] tree-mask word of each row
  int* entries;        // [S][BN] block-table entry of each key's page
  int* row_qmax;       // quantized: [BM] max |q * smooth| of each row, float bits (inf: non-finite)
  // [kWarpsN][BM][m, l], then the lse and the quantized scales (float2 loads:
  // kIntBytes keeps 16-byte alignment)
  float* merge;
  float* lse;    // [BM]
  float* scale;  // quantized: [S][K, V][BN] per-key scales, copied with their tile
  // A walking block's merge of its splits (kSplitMergeBytes past the rest):
  float* split_acc;  // [BM][D]
  float* split_max;  // [BM]
  float* split_den;  // [BM]

  __device__ __forceinline__ explicit TileSmem(uint8_t* smem)
      : kv(smem),
        conv(reinterpret_cast<T*>(smem + Cfg::kKVBytes)),
        o(reinterpret_cast<float*>(smem)),
        q(reinterpret_cast<T*>(smem + Cfg::kMainBytes)),
        key_rows(reinterpret_cast<int*>(smem + Cfg::kMainBytes + Cfg::kQBytes)),
        flags(key_rows + Cfg::kRowSlots * BN),
        row_token(flags + Cfg::kRowSlots * kFlags),
        row_head(row_token + BM),
        row_qpos(row_head + BM),
        row_tree(reinterpret_cast<uint32_t*>(row_qpos + BM)),
        entries(reinterpret_cast<int*>(row_tree + BM)),
        row_qmax(entries + Cfg::kStages * BN),
        merge(reinterpret_cast<float*>(smem + Cfg::kMainBytes + Cfg::kQBytes + Cfg::kIntBytes)),
        lse(merge + 2 * Cfg::kWarpsN * BM),
        scale(lse + BM),
        split_acc(reinterpret_cast<float*>(smem + Cfg::kSmemBytes)),
        split_max(split_acc + BM * Cfg::D),
        split_den(split_max + BM) {}
};

}  // namespace tileinfer
