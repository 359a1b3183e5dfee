// Stand-alone check of the wgmma building blocks of attention_wgmma.cuh, with
// no torch and no paging: two warpgroups (as the kernel's block) stage Q
// (128 x 128: the kernel's BM = 128 layout, each warpgroup's 64 rows at
// 64 wg * 128 bytes into each half), K and V (BN x 128) in the kernel's
// 128-byte-swizzled layout (WgmmaPrefillConfig::offset), then
//   S = Q K^T  with Mma<T, BN>::ss (both operands from shared memory, K-major),
//   O = P V    with Mma<T, 128>::rs_tnsp_b (P from registers in the accumulator
//              layout, V N-major),
// and compares both with a CPU product of the same rounded inputs (outputs are
// NaN-poisoned first, and a NaN / inf anywhere fails). If the
// prefill tests fail, this tells a descriptor / layout / fragment error from a
// pipeline or masking one. Build and run (H100 / H200):
//   bash scripts/wgmma_selftest.sh
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "tileinfer/attention_wgmma.cuh"

#include "cuda_check.h"

using namespace tileinfer;

constexpr int kRows = 128;  // query rows: two warpgroups, as the kernel's blocks

template <typename T, int BN>
__global__ void __launch_bounds__(256, 1)
    selftest_kernel(const T* q, const T* k, const T* v, const float* pm, float* s_out, float* o_out) {
#if TILEINFER_WGMMA_ENABLED
  using Cfg = WgmmaPrefillConfig<T, 128, 2, BN, 2>;
  static_assert(Cfg::kBlockM == kRows, "the kernel's block rows");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint8_t* q_s = smem;
  uint8_t* k_s = q_s + kRows * 256;
  uint8_t* v_s = k_s + BN * 256;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
  const int wg = warp >> 2;
  // Ordinary 16-byte stores (the kernel uses cp.async; both are generic-proxy writes).
  for (int i = tid; i < kRows * 16; i += 256)
    *reinterpret_cast<uint4*>(q_s + Cfg::offset(kRows, i / 16, i % 16)) = reinterpret_cast<const uint4*>(q)[i];
  for (int i = tid; i < BN * 16; i += 256) {
    *reinterpret_cast<uint4*>(k_s + Cfg::offset(BN, i / 16, i % 16)) = reinterpret_cast<const uint4*>(k)[i];
    *reinterpret_cast<uint4*>(v_s + Cfg::offset(BN, i / 16, i % 16)) = reinterpret_cast<const uint4*>(v)[i];
  }
  wgmma::fence_proxy_async_smem();
  __syncthreads();

  // The kernel's addresses: this warpgroup's 64 rows of Q's first half; halves kRows * 128 bytes apart.
  const uint32_t qa = smem_addr(q_s) + 64 * wg * 128, ka = smem_addr(k_s), va = smem_addr(v_s);
  float acc[BN / 2];
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint32_t koff = (kk & 3) * 32;
    wgmma::Mma<T, BN>::ss(acc, wgmma::desc_sw128(qa + (kk >> 2) * kRows * 128 + koff, 16, 1024),
                          wgmma::desc_sw128(ka + (kk >> 2) * BN * 128 + koff, 16, 1024), kk > 0 ? 1 : 0);
  }
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::fence_regs(acc);
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int R = 0; R < 2; ++R)
#pragma unroll
      for (int e = 0; e < 2; ++e) s_out[(16 * warp + g + 8 * R) * BN + 8 * j + 2 * c + e] = acc[4 * j + 2 * R + e];

  // P (kRows x BN, given) in the A-fragment layout: a[kk] = rows r0 / r0 + 8, keys 16 kk + 2c (+8).
  const int r0 = 16 * warp + g;  // warp w of the block: row 64 wg + 16 (w % 4) + g
  uint32_t a[BN / 16][4];
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    const int k0 = 16 * kk + 2 * c;
    a[kk][0] = pack2<T>(pm[r0 * BN + k0], pm[r0 * BN + k0 + 1]);
    a[kk][1] = pack2<T>(pm[(r0 + 8) * BN + k0], pm[(r0 + 8) * BN + k0 + 1]);
    a[kk][2] = pack2<T>(pm[r0 * BN + k0 + 8], pm[r0 * BN + k0 + 9]);
    a[kk][3] = pack2<T>(pm[(r0 + 8) * BN + k0 + 8], pm[(r0 + 8) * BN + k0 + 9]);
  }
  float o[64];
#pragma unroll
  for (int x = 0; x < 64; ++x) o[x] = 0.f;
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) wgmma::fence_regs(a[kk]);
  wgmma::fence_regs(o);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk)
    wgmma::Mma<T, 128>::rs_tnsp_b(o, a[kk], wgmma::desc_sw128(va + kk * 16 * 128, BN * 128, 1024));
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::fence_regs(o);
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) wgmma::fence_regs(a[kk]);
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int R = 0; R < 2; ++R)
#pragma unroll
      for (int e = 0; e < 2; ++e) o_out[(r0 + 8 * R) * 128 + 8 * j + 2 * c + e] = o[4 * j + 2 * R + e];
#endif
}

float to_float_host(float x, __nv_bfloat16*) { return __bfloat162float(__float2bfloat16_rn(x)); }
float to_float_host(float x, __half*) { return __half2float(__float2half_rn(x)); }

template <typename T>
T from_host(float x);
template <>
__nv_bfloat16 from_host<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__half from_host<__half>(float x) { return __float2half_rn(x); }

template <typename T, int BN>
bool run(const char* name) {
  srand(1234 + BN);
  auto rnd = [] { return static_cast<float>(rand()) / RAND_MAX * 2.f - 1.f; };
  std::vector<float> qf(kRows * 128), kf(BN * 128), vf(BN * 128), pf(kRows * BN);
  std::vector<T> qh(qf.size()), kh(kf.size()), vh(vf.size());
  for (size_t i = 0; i < qf.size(); ++i) qh[i] = from_host<T>(qf[i] = rnd()), qf[i] = to_float_host(qf[i], (T*)nullptr);
  for (size_t i = 0; i < kf.size(); ++i) kh[i] = from_host<T>(kf[i] = rnd()), kf[i] = to_float_host(kf[i], (T*)nullptr);
  for (size_t i = 0; i < vf.size(); ++i) vh[i] = from_host<T>(vf[i] = rnd()), vf[i] = to_float_host(vf[i], (T*)nullptr);
  for (size_t i = 0; i < pf.size(); ++i) pf[i] = to_float_host(0.5f * (rnd() + 1.f), (T*)nullptr);  // exact in T

  T *q, *k, *v;
  float *pm, *s, *o;
  CHECK(cudaMalloc(&q, qh.size() * sizeof(T)));
  CHECK(cudaMalloc(&k, kh.size() * sizeof(T)));
  CHECK(cudaMalloc(&v, vh.size() * sizeof(T)));
  CHECK(cudaMalloc(&pm, pf.size() * 4));
  CHECK(cudaMalloc(&s, kRows * BN * 4));
  CHECK(cudaMalloc(&o, kRows * 128 * 4));
  CHECK(cudaMemset(s, 0xFF, kRows * BN * 4));  // NaN: an element the kernel does not write fails
  CHECK(cudaMemset(o, 0xFF, kRows * 128 * 4));
  CHECK(cudaMemcpy(q, qh.data(), qh.size() * sizeof(T), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(k, kh.data(), kh.size() * sizeof(T), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(v, vh.data(), vh.size() * sizeof(T), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(pm, pf.data(), pf.size() * 4, cudaMemcpyHostToDevice));
  const int smem = 1024 + (kRows + 2 * BN) * 256;
  CHECK(cudaFuncSetAttribute(selftest_kernel<T, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  selftest_kernel<T, BN><<<1, 256, smem>>>(q, k, v, pm, s, o);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<float> sg(kRows * BN), og(kRows * 128);
  CHECK(cudaMemcpy(sg.data(), s, sg.size() * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(og.data(), o, og.size() * 4, cudaMemcpyDeviceToHost));

  // A NaN / inf result (unwritten: the poison, or garbage) counts as an infinite error.
  auto err_of = [](double ref, float got) { return std::isfinite(got) ? std::fabs(ref - got) : INFINITY; };
  double s_err = 0, o_err = 0;
  int s_bad_r = -1, s_bad_c = -1, o_bad_r = -1, o_bad_c = -1;
  for (int r = 0; r < kRows; ++r)
    for (int n = 0; n < BN; ++n) {
      double ref = 0;
      for (int d = 0; d < 128; ++d) ref += double(qf[r * 128 + d]) * kf[n * 128 + d];
      const double e = err_of(ref, sg[r * BN + n]);
      if (e > s_err) s_err = e, s_bad_r = r, s_bad_c = n;
    }
  for (int r = 0; r < kRows; ++r)
    for (int d = 0; d < 128; ++d) {
      double ref = 0;
      for (int n = 0; n < BN; ++n) ref += double(pf[r * BN + n]) * vf[n * 128 + d];
      const double e = err_of(ref, og[r * 128 + d]);
      if (e > o_err) o_err = e, o_bad_r = r, o_bad_c = d;
    }
  // fp32 accumulation of exact products: errors ~1e-6 of the magnitude (~10); a
  // layout error gives O(1).
  const bool ok = s_err < 1e-3 && o_err < 1e-3;
  std::printf("%-5s BN=%3d  S max err %.3g (row %d, key %d)  O max err %.3g (row %d, col %d)  %s\n", name, BN, s_err,
              s_bad_r, s_bad_c, o_err, o_bad_r, o_bad_c, ok ? "PASS" : "FAIL");
  cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(pm), cudaFree(s), cudaFree(o);
  return ok;
}

int main() {
  bool ok = true;
  ok &= run<__nv_bfloat16, 64>("bf16");
  ok &= run<__nv_bfloat16, 128>("bf16");
  ok &= run<__half, 64>("fp16");
  ok &= run<__half, 128>("fp16");
  std::printf(ok ? "wgmma selftest: all PASS\n" : "wgmma selftest: FAIL\n");
  return ok ? 0 : 1;
}
