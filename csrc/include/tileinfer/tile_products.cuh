// The tile kernel's two products of a key tile (attention_kernel.cuh), on
// the tensor cores (mma.sync, mma.cuh). S = Q K^T for each cache type: bf16 /
// fp16 products of the staged queries and keys; int8: exact integer products
// of the query's two int8 planes with the keys as stored, turned back into
// scores by each row's 2^-e; fp8: fp16 products with the keys converted in
// registers right after their ldmatrix. O += P V: P rounded to the values'
// element type (fp16 over a quantized cache, whose values are converted
// exactly).
#pragma once

#include <cstdint>
#include <type_traits>

#include "fp8.cuh"
#include "mma.cuh"
#include "quant.cuh"
#include "tile_config.cuh"

namespace tileinfer {

// s[R][2j + e]: row R, key key0 + 8j + 2(lane % 4) + e of the warp's slice.
// k_stage: the staged K tile; k_row / cols_k: this lane's ldmatrix row and
// swizzled columns in it; q_frags(a, f): the A fragments of k-step f (see
// the kernel); row_unscale: the quantized rows' 2^-e times the score map's factor.
template <class Cfg, int kR, class QFrags>
__device__ __forceinline__ void tile_scores(float (&s)[kR][Cfg::kWarpN / 4], const uint8_t* k_stage, int k_row,
                                            const SwizzleCols& cols_k, QFrags q_frags,
                                            const float (&row_unscale)[Cfg::kQuant ? kR : 1]) {
  using T = typename Cfg::T;
  constexpr int D = Cfg::D;
  constexpr int WN = Cfg::kWarpN;
  if constexpr (Cfg::kInt8) {
    // Exact integer products of the two query planes with the staged keys:
    // q k = 256 (hi k) + (lo k), at most 2^14 * 127 * D in magnitude (< 2^31).
    int acc[kR][WN / 4];
#pragma unroll
    for (int R = 0; R < kR; ++R)
#pragma unroll
      for (int x = 0; x < WN / 4; ++x) acc[R][x] = 0;
    const uint32_t k_tile = smem_addr(k_stage);
    auto k_frag = [&](uint32_t (&b)[4], int np, int kk) {  // keys 16 np.., columns 32 kk..
      ldmatrix_x4(b, k_tile + k_row + np * 16 * D + 2 * cols_k(kk));
    };
    if constexpr (Cfg::kRowTiles == 1) {
      // Each key fragment read once for both planes, into a second accumulator.
      int acc_lo[kR][WN / 4];
#pragma unroll
      for (int R = 0; R < kR; ++R)
#pragma unroll
        for (int x = 0; x < WN / 4; ++x) acc_lo[R][x] = 0;
#pragma unroll
      for (int kk = 0; kk < D / 32; ++kk) {
        uint32_t a_hi[Cfg::kRowTiles][4], a_lo[Cfg::kRowTiles][4];
        q_frags(a_hi, 2 * kk);
        q_frags(a_lo, 2 * kk + 1);
#pragma unroll
        for (int np = 0; np < WN / 16; ++np) {  // 16 keys: two 8-key n-blocks
          uint32_t b[4];
          k_frag(b, np, kk);
          mma_row_tiles<int8_t>(acc, a_hi, b, np);
          mma_row_tiles<int8_t>(acc_lo, a_lo, b, np);
        }
      }
#pragma unroll
      for (int R = 0; R < kR; ++R)
#pragma unroll
        for (int x = 0; x < WN / 4; ++x) acc[R][x] = 256 * acc[R][x] + acc_lo[R][x];
    } else {
      // Two row tiles: a second accumulator beside their outputs would spill,
      // so the planes take turns and the key fragments are read twice.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (h == 1) {
#pragma unroll
          for (int R = 0; R < kR; ++R)
#pragma unroll
            for (int x = 0; x < WN / 4; ++x) acc[R][x] *= 256;
        }
#pragma unroll
        for (int kk = 0; kk < D / 32; ++kk) {
          uint32_t a[Cfg::kRowTiles][4];
          q_frags(a, 2 * kk + h);
#pragma unroll
          for (int np = 0; np < WN / 16; ++np) {
            uint32_t b[4];
            k_frag(b, np, kk);
            mma_row_tiles<int8_t>(acc, a, b, np);
          }
        }
      }
    }
#pragma unroll
    for (int R = 0; R < kR; ++R)
#pragma unroll
      for (int x = 0; x < WN / 4; ++x) s[R][x] = static_cast<float>(acc[R][x]) * row_unscale[R];
  } else {
#pragma unroll
    for (int R = 0; R < kR; ++R)
#pragma unroll
      for (int x = 0; x < WN / 4; ++x) s[R][x] = 0.f;
    const uint32_t k_tile = smem_addr(k_stage);
    if constexpr (Cfg::kFp8) {
      // fp16 products of the staged queries (q * 2^e) with the keys converted
      // in registers: an ldmatrix of e4m3 rows gives lane (g, c) key g's
      // columns 4c .. 4c + 3 of each 16-column chunk (the int8 B layout,
      // mma.cuh), two fp16 pairs once converted, which an m16n8k16 product
      // takes as its k pairs (2c, 2c + 1) and (2c + 8, 2c + 9): the query
      // columns were staged in that order. Keys 16 np.., columns 32 kk..
#pragma unroll
      for (int kk = 0; kk < D / 32; ++kk) {
        uint32_t a0[Cfg::kRowTiles][4], a1[Cfg::kRowTiles][4];
        q_frags(a0, 2 * kk);
        q_frags(a1, 2 * kk + 1);
#pragma unroll
        for (int np = 0; np < WN / 16; ++np) {
          uint32_t b8[4];  // keys 0-7: columns 32 kk + [0, 16), [16, 32); keys 8-15: the same
          ldmatrix_x4(b8, k_tile + k_row + np * 16 * D + 2 * cols_k(kk));
          uint32_t b0[4], b1[4];
          fp8x4_to_half(b8[0], b0[0], b0[1]);
          fp8x4_to_half(b8[2], b0[2], b0[3]);
          fp8x4_to_half(b8[1], b1[0], b1[1]);
          fp8x4_to_half(b8[3], b1[2], b1[3]);
          mma_row_tiles<T>(s, a0, b0, np);
          mma_row_tiles<T>(s, a1, b1, np);
        }
      }
#pragma unroll
      for (int R = 0; R < kR; ++R)
#pragma unroll
        for (int x = 0; x < WN / 4; ++x) s[R][x] *= row_unscale[R];
    } else {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[Cfg::kRowTiles][4];
        q_frags(a, kk);
#pragma unroll
        for (int np = 0; np < WN / 16; ++np) {  // 16 keys: two 8-key n-blocks
          uint32_t b[4];
          ldmatrix_x4(b, k_tile + 2 * (k_row + np * 16 * D + cols_k(kk)));
          mma_row_tiles<T>(s, a, b, np);
        }
      }
    }
  }
}

// O += P V for one key tile: s holds the probabilities (row R, key key0 + 8j
// + 2(lane % 4) + e at [R][2j + e]), rounded to T for the product; v_tile:
// the tile's values in shared memory (T, or with kValuesInRegs the int8 / fp8
// values as staged, converted in registers), v_row / cols_a / cols_q8 this
// lane's ldmatrix row and swizzled columns in it.
template <class Cfg, int kR>
__device__ __forceinline__ void tile_pv(float (&o)[kR][Cfg::D / 4], const float (&s)[kR][Cfg::kWarpN / 4],
                                        uint32_t v_tile, int v_row, const SwizzleCols& cols_a,
                                        const SwizzleCols& cols_q8) {
  using T = typename Cfg::T;
  using QF = QuantFormat<std::conditional_t<Cfg::kQuant, typename Cfg::CacheT, int8_t>>;
  constexpr int D = Cfg::D;
  constexpr int WN = Cfg::kWarpN;
#pragma unroll
  for (int kk = 0; kk < WN / 16; ++kk) {
    uint32_t a[Cfg::kRowTiles][4];
#pragma unroll
    for (int mt = 0; mt < Cfg::kRowTiles; ++mt) {
      const float* s0 = s[2 * mt];
      const float* s1 = s[2 * mt + 1];
      a[mt][0] = pack2<T>(s0[4 * kk], s0[4 * kk + 1]);
      a[mt][1] = pack2<T>(s1[4 * kk], s1[4 * kk + 1]);
      a[mt][2] = pack2<T>(s0[4 * kk + 2], s0[4 * kk + 3]);
      a[mt][3] = pack2<T>(s1[4 * kk + 2], s1[4 * kk + 3]);
    }
    if constexpr (Cfg::kValuesInRegs) {
      // int8 values from their staged tile (rows of D bytes): a transposed
      // ldmatrix of 16-byte chunks gives lane (g, c) the bytes of keys 2c,
      // 2c + 1 at columns 2g, 2g + 1 of the chunk, converted to two fp16 B
      // fragments (int8.cuh): columns 16 ch + 2n (n-block 0 of pair ch) and
      // 16 ch + 2n + 1 (n-block 1). So o[R][4 ch + 2 j + e] holds column
      // 16 ch + 4 (lane % 4) + 2 e + j (the epilogue puts them in order).
#pragma unroll
      for (int m = 0; m < D / 32; ++m) {  // chunks 2m, 2m + 1
        uint32_t r[4];  // [chunk 2m: keys 0-7, keys 8-15; chunk 2m + 1: ...]
        ldmatrix_x4_trans(r, v_tile + v_row + kk * 16 * D + 2 * cols_q8(m));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t b[4];
          QF::key_pairs_to_half(r[2 * h], r[2 * h + 1], b);
          mma_row_tiles<T>(o, a, b, 2 * m + h);
        }
      }
    } else {
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {  // 16 output columns: two 8-column n-blocks
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_tile + 2 * (v_row + kk * 16 * D + cols_a(dp)));
        mma_row_tiles<T>(o, a, b, dp);
      }
    }
  }
}

}  // namespace tileinfer
