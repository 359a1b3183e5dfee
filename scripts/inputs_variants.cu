// Experiment: the fused attention inputs' two kernels (rows_kernel: q RMSNorm +
// RoPE; kv_write_kernel: k RMSNorm + RoPE and the cache write of k and v) on
// one prefill-sized step: 4096 tokens of one sequence, Qwen3-4B shapes (bf16,
// d 128, 32 query and 8 KV heads of a packed qkv, page 64, pages in random
// order). Times each kernel alone (the queries kernel with 1 row per thread
// group and with the launcher's rows per group, and with stages switched off),
// the pair as attention_inputs launches it (programmatic, the keys / values
// kernel not waiting at its start), and plain copies of the step's bytes;
// with OLD_INPUTS set (a path to an earlier
// inputs.cuh: inputs_variants.sh's argument), the same for that version,
// outputs compared bit for bit. Also checks, over every pair of
// 16-bit values, whether the packed multiply (__hmul2_rn) rounds as the fp32
// product rounded to the type.
// No torch. Build and run on the GPU: bash scripts/inputs_variants.sh
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

// The earlier kernels first: calls in the new header then find only its own
// functions (the old ones are declared in another namespace).
#include "tileinfer/common.cuh"
#include "tileinfer/paged_kv.cuh"
#ifdef OLD_INPUTS
namespace old {
using namespace ::tileinfer;
namespace tileinfer {
// What headers from before 2026-11-29's session 7 took from paged_kv.cuh.
__device__ __forceinline__ int seq_of_token(const PagedKVParams& p, int token) {
  int lo = 0, hi = p.num_seqs;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (p.cu_seqlens_q[mid] <= token) lo = mid; else hi = mid;
  }
  if (p.num_seqs <= 0) return -1;
  return (p.cu_seqlens_q[lo] <= token && token < p.cu_seqlens_q[lo + 1]) ? lo : -1;
}
}  // namespace tileinfer
#include OLD_INPUTS
}  // namespace old
#endif
#include "tileinfer/inputs.cuh"

#include "cuda_check.h"

using namespace tileinfer;

using T = __nv_bfloat16;
constexpr int kD = 128, kHq = 32, kHkv = 8, kHeads = kHq + 2 * kHkv, kPage = 64;

// Mismatches between __hmul2_rn and the fp32 product rounded to the type, over
// all 2^32 pairs (a, b) of 16-bit values (thread a: every b); NaN = NaN.
template <typename H2, typename H>
__global__ void hmul_check(unsigned long long* bad) {
  const uint32_t a = blockIdx.x * blockDim.x + threadIdx.x;
  if (a >= 65536) return;
  unsigned long long n = 0;
  for (uint32_t b = 0; b < 65536; b += 2) {
    const uint32_t wa = a | (a << 16), wb = b | ((b + 1) << 16);
    H2 x = *reinterpret_cast<const H2*>(&wa), y = *reinterpret_cast<const H2*>(&wb);
    const H2 z = __hmul2_rn(x, y);
    const float2 fx = ElemPair<H>::unpack(x), fy = ElemPair<H>::unpack(y);
    const H2 r = ElemPair<H>::round(__fmul_rn(fx.x, fy.x), __fmul_rn(fx.y, fy.y));
    const float2 fz = ElemPair<H>::unpack(z), fr = ElemPair<H>::unpack(r);
    const uint32_t bz = *reinterpret_cast<const uint32_t*>(&z), br = *reinterpret_cast<const uint32_t*>(&r);
    const bool lo_ok = (bz & 0xffff) == (br & 0xffff) || (isnan(fz.x) && isnan(fr.x));
    const bool hi_ok = (bz >> 16) == (br >> 16) || (isnan(fz.y) && isnan(fr.y));
    n += !lo_ok + !hi_ok;
  }
  if (n) atomicAdd(bad, n);
}

// Memory speed for the step's bytes: row-by-row copies (rows of kRowVecs
// 16-byte vectors, a source row stride in vectors, contiguous destination),
// each thread moving kUnroll vectors at once, grid-stride. No metadata, no
// math: what the inputs kernels' loads and stores would take as a plain copy.
template <int kRowVecs, int kUnroll>
__global__ void __launch_bounds__(256) copy_rows(const uint4* src, int64_t src_stride, uint4* dst, int64_t rows) {
  const int64_t n = rows * kRowVecs;
  for (int64_t base = (int64_t(blockIdx.x) * 256 * kUnroll) + threadIdx.x; base < n;
       base += int64_t(gridDim.x) * 256 * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * 256;
      if (i < n) v[u] = src[(i / kRowVecs) * src_stride + i % kRowVecs];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * 256;
      if (i < n) dst[i] = v[u];
    }
  }
}

int main() {
  const int tokens = 4096, max_pos = 8192, pages = tokens / kPage + 8;
  std::mt19937 rng(1);
  std::vector<T> qkv(size_t(tokens) * kHeads * kD), w(kD), kw(kD);
  for (auto& v : qkv) v = __float2bfloat16(float(int(rng() % 2001) - 1000) / 500.f);
  for (auto& v : w) v = __float2bfloat16(0.5f + float(rng() % 1000) / 1000.f);
  for (auto& v : kw) v = __float2bfloat16(0.5f + float(rng() % 1000) / 1000.f);
  std::vector<float> cs(size_t(max_pos) * kD);
  for (int pos = 0; pos < max_pos; ++pos)
    for (int c = 0; c < kD / 2; ++c) {
      const double a = pos * std::pow(1e6, -2.0 * c / kD);
      cs[size_t(pos) * kD + c] = float(std::cos(a));
      cs[size_t(pos) * kD + kD / 2 + c] = float(std::sin(a));
    }
  std::vector<int> table(tokens / kPage);
  std::iota(table.begin(), table.end(), 4);
  std::shuffle(table.begin(), table.end(), rng);
  const int seq_lens[1] = {tokens}, cu[2] = {0, tokens};

  T *d_qkv, *d_w, *d_kw, *d_out0, *d_out1;
  float* d_cs;
  int *d_lens, *d_cu, *d_table;
  const size_t out_bytes = size_t(tokens) * kHq * kD * 2;
  const size_t pool_bytes = size_t(pages) * kHkv * kPage * kD * 2;
  CHECK(cudaMalloc(&d_qkv, qkv.size() * 2));
  CHECK(cudaMalloc(&d_w, kD * 2));
  CHECK(cudaMalloc(&d_kw, kD * 2));
  CHECK(cudaMalloc(&d_out0, out_bytes));
  CHECK(cudaMalloc(&d_out1, out_bytes));
  CHECK(cudaMalloc(&d_cs, cs.size() * 4));
  CHECK(cudaMalloc(&d_lens, 4));
  CHECK(cudaMalloc(&d_cu, 8));
  CHECK(cudaMalloc(&d_table, table.size() * 4));
  T* pool[2][2];  // [version][k, v]
  for (auto& pv : pool)
    for (auto& pp : pv) {
      CHECK(cudaMalloc(&pp, pool_bytes));
      CHECK(cudaMemset(pp, 0x7f, pool_bytes));
    }
  CHECK(cudaMemcpy(d_qkv, qkv.data(), qkv.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_w, w.data(), kD * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_kw, kw.data(), kD * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_cs, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_lens, seq_lens, 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_cu, cu, 8, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));

  PagedKVParams kv{};
  kv.block_tables = d_table;
  kv.seq_lens = d_lens;
  kv.cu_seqlens_q = d_cu;
  kv.num_seqs = 1;
  kv.max_pages = static_cast<int>(table.size());
  kv.num_pages = pages;
  kv.num_kv_heads = kHkv;
  kv.page_size = kPage;
  kv.head_dim = kD;
  const RopeTable rope{d_cs, kD, max_pos, kD, true};

  RowsParams p{};
  p.x = d_qkv;
  p.x_stride_token = kHeads * kD;
  p.x_stride_head = kD;
  p.out = d_out0;
  p.out_stride_token = kHq * kD;
  p.out_stride_head = kD;
  p.weight = d_w;
  p.eps = 1e-6f;
  p.rope = rope;
  p.kv = kv;
  p.num_tokens = tokens;
  p.num_heads = kHq;

  KVWriteParams kp{};
  kp.kv = kv;
  kp.k = d_qkv + kHq * kD;
  kp.v = d_qkv + (kHq + kHkv) * kD;
  kp.k_stride_token = kp.v_stride_token = kHeads * kD;
  kp.k_stride_head = kp.v_stride_head = kD;
  kp.k_weight = d_kw;
  kp.eps = 1e-6f;
  kp.rope = rope;
  kp.num_tokens = tokens;

  // ITERS=1 (under a profiler): one timed launch per kernel (and one warm-up).
  const int iters = std::getenv("ITERS") ? std::max(1, std::atoi(std::getenv("ITERS"))) : 100;
  auto time_kernel_us = [&](auto launch) { return time_us(launch, iters, std::min(5, iters)); };
  const double q_bytes = 2.0 * out_bytes;                     // q rows read + written
  const double kv_bytes = 4.0 * tokens * kHkv * kD * 2;       // k, v rows read + written
  using L = RowLayout<T, kD>;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // The launcher's rows per queries group (4 on this step) and grids; an
  // OLD_INPUTS header's kernels (before 2026-11-29's session 8) take a row per
  // group.
  p.rows_per_group = rows_per_group_for(int64_t(tokens) * kHq, L::kGroups, sms);
  const int kv_grid = tokens * kHkv / L::kGroups;
  auto q_grid_for = [&](int rows_per_group) { return tokens * kHq / (L::kGroups * rows_per_group); };

  // The package's kernels (index 0) and, with OLD_INPUTS, the earlier ones (1).
  // (The earlier parameter structs are a prefix of these, copied as bytes.)
  auto run = [&]<typename RP, typename KP>(int version, const char* name, void (*rows)(RP), void (*kvw)(KP),
                                           int rows_per_group) {
    static_assert(sizeof(RP) <= sizeof(RowsParams) && sizeof(KP) == sizeof(KVWriteParams));
    RowsParams qn = p;
    qn.rows_per_group = rows_per_group;
    qn.out = version == 0 ? d_out0 : d_out1;
    KVWriteParams kn = kp;
    kn.k_pool = pool[version][0];
    kn.v_pool = pool[version][1];
    kn.kv.k_cache = kn.k_pool;
    kn.kv.v_cache = kn.v_pool;
    RP q;
    KP k;
    std::memcpy(&q, &qn, sizeof q);
    std::memcpy(&k, &kn, sizeof k);
    KP after = k;
    after.after_queries = true;
    const int q_grid = q_grid_for(rows_per_group);
    const double tq = time_kernel_us([&] { CHECK(launch_kernel(rows, dim3(q_grid), dim3(kInputsThreads), 0, 0, true, q)); });
    const double tk = time_kernel_us([&] { CHECK(launch_kernel(kvw, dim3(kv_grid), dim3(kInputsThreads), 0, 0, true, k)); });
    const double tp = time_kernel_us([&] {
      CHECK(launch_kernel(rows, dim3(q_grid), dim3(kInputsThreads), 0, 0, true, q));
      CHECK(launch_kernel(kvw, dim3(kv_grid), dim3(kInputsThreads), 0, 0, true, after));
    });
    std::printf("%-4s %d rows per group: queries %6.1f us (%4.0f GB/s) | keys+values %6.1f us (%4.0f GB/s) | pair %6.1f us "
                "(%4.0f GB/s)\n", name, rows_per_group, tq, q_bytes / tq / 1e3, tk, kv_bytes / tk / 1e3, tp,
                (q_bytes + kv_bytes) / tp / 1e3);
  };
  auto rows_new = rows_kernel<T, kD, true, PosFrom::kMetadata>;
  auto kv_new = kv_write_kernel<T, kD, true, true, false>;
  run(0, "new", rows_new, kv_new, 1);
  run(0, "new", rows_new, kv_new, p.rows_per_group);  // last: the outputs compared below
  {
    // Rows per group as the launcher gives them: the launcher's with a
    // rotation, one without (nothing to share).
    RowsParams s = p, s1 = p;
    s.out = s1.out = d_out1;
    s1.rows_per_group = 1;
    const int grid = q_grid_for(s.rows_per_group), grid1 = q_grid_for(1);
    const double t_norm = time_kernel_us([&] { rows_kernel<T, kD, true, PosFrom::kNone><<<grid1, kInputsThreads>>>(s1); });
    const double t_rope = time_kernel_us([&] { rows_kernel<T, kD, false, PosFrom::kMetadata><<<grid, kInputsThreads>>>(s); });
    const double t_copy = time_kernel_us([&] { rows_kernel<T, kD, false, PosFrom::kNone><<<grid1, kInputsThreads>>>(s1); });
    std::printf("     queries kernel with norm only %.1f us, rope only %.1f, neither (a copy of the rows) %.1f (%.0f GB/s)\n",
                t_norm, t_rope, t_copy, q_bytes / t_copy / 1e3);
  }
  {
    // The step's bytes as plain copies (q -> q_out; k and v -> contiguous
    // slabs standing for their pages): cudaMemcpy2DAsync, and copy_rows on
    // one block per 256 x kUnroll vectors or on 2-8 blocks per SM.
    uint4* slab;
    CHECK(cudaMalloc(&slab, size_t(tokens) * 2 * kHkv * kD * 2));
    const size_t pitch = size_t(kHeads) * kD * 2, q_row = size_t(kHq) * kD * 2, kv_row = size_t(kHkv) * kD * 2;
    const uint4* src = reinterpret_cast<const uint4*>(d_qkv);
    uint4* q_dst = reinterpret_cast<uint4*>(d_out1);
    const int64_t stride = pitch / 16;
    const double t_2d_q = time_kernel_us([&] {
      CHECK(cudaMemcpy2DAsync(d_out1, q_row, d_qkv, pitch, q_row, tokens, cudaMemcpyDeviceToDevice));
    });
    const double t_2d_all = time_kernel_us([&] {
      CHECK(cudaMemcpy2DAsync(d_out1, q_row, d_qkv, pitch, q_row, tokens, cudaMemcpyDeviceToDevice));
      CHECK(cudaMemcpy2DAsync(slab, 2 * kv_row, d_qkv + kHq * kD, pitch, 2 * kv_row, tokens, cudaMemcpyDeviceToDevice));
    });
    std::printf("     plain copies of the bytes: cudaMemcpy2DAsync q %.1f us (%.0f GB/s), q + k/v %.1f us (%.0f GB/s)\n",
                t_2d_q, q_bytes / t_2d_q / 1e3, t_2d_all, (q_bytes + kv_bytes) / t_2d_all / 1e3);
    // The same byte counts from contiguous sources (qkv's first tokens stand for them).
    const double t_1d_q = time_kernel_us([&] {
      CHECK(cudaMemcpyAsync(d_out1, d_qkv, out_bytes, cudaMemcpyDeviceToDevice));
    });
    const double t_1d_all = time_kernel_us([&] {
      CHECK(cudaMemcpyAsync(d_out1, d_qkv, out_bytes, cudaMemcpyDeviceToDevice));
      CHECK(cudaMemcpyAsync(slab, d_qkv + out_bytes / 2, size_t(kv_bytes) / 2, cudaMemcpyDeviceToDevice));
    });
    std::printf("     contiguous copies of as many bytes: cudaMemcpyAsync q %.1f us (%.0f GB/s), q + k/v %.1f us (%.0f GB/s)\n",
                t_1d_q, q_bytes / t_1d_q / 1e3, t_1d_all, (q_bytes + kv_bytes) / t_1d_all / 1e3);
    auto q_copy = [&]<int U>(int grid) {
      return time_kernel_us([&] { copy_rows<kHq * kD / 8, U><<<grid, 256>>>(src, stride, q_dst, tokens); });
    };
    auto all_copy = [&]<int U>(int grid) {
      return time_kernel_us([&] {
        copy_rows<kHq * kD / 8, U><<<grid, 256>>>(src, stride, q_dst, tokens);
        copy_rows<2 * kHkv * kD / 8, U><<<grid / 4, 256>>>(src + kHq * kD / 8, stride, slab, tokens);
      });
    };
    auto report = [&](const char* how, auto q_time, auto all_time) {
      std::printf("     copy_rows %-28s q %5.1f us (%4.0f GB/s), q + k/v %5.1f us (%4.0f GB/s)\n", how, q_time,
                  q_bytes / q_time / 1e3, all_time, (q_bytes + kv_bytes) / all_time / 1e3);
    };
    const int q_vecs = tokens * kHq * kD / 8;
    report("1 vector/thread, full grid", q_copy.template operator()<1>(q_vecs / 256), all_copy.template operator()<1>(q_vecs / 256));
    report("4 vectors/thread, full grid", q_copy.template operator()<4>(q_vecs / 1024), all_copy.template operator()<4>(q_vecs / 1024));
    {  // the same kernel reading contiguous rows (qkv's first tokens): the cost of the strided source
      const int64_t q_rv = kHq * kD / 8, kv_rv = 2 * kHkv * kD / 8;
      const double tq = time_kernel_us([&] { copy_rows<kHq * kD / 8, 1><<<q_vecs / 256, 256>>>(src, q_rv, q_dst, tokens); });
      const double ta = time_kernel_us([&] {
        copy_rows<kHq * kD / 8, 1><<<q_vecs / 256, 256>>>(src, q_rv, q_dst, tokens);
        copy_rows<2 * kHkv * kD / 8, 1><<<q_vecs / 1024, 256>>>(src + tokens * q_rv, kv_rv, slab, tokens);
      });
      report("1 vector/thread, contiguous", tq, ta);
    }
    for (int b : {2, 4, 8}) {
      char how[64];
      std::snprintf(how, sizeof how, "4 vectors/thread, %d blocks/SM", b);
      report(how, q_copy.template operator()<4>(b * sms), all_copy.template operator()<4>(b * sms));
    }
    CHECK(cudaFree(slab));
  }
#ifdef OLD_INPUTS
  auto fetch = [](const void* d, size_t n) {
    std::vector<uint8_t> h(n);
    CHECK(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost));
    return h;
  };
  run(1, "old", old::tileinfer::rows_kernel<T, kD, true, old::tileinfer::PosFrom::kMetadata>,
      old::tileinfer::kv_write_kernel<T, kD, true, true, false>, 1);
  const bool q_same = fetch(d_out0, out_bytes) == fetch(d_out1, out_bytes);
  const bool k_same = fetch(pool[0][0], pool_bytes) == fetch(pool[1][0], pool_bytes);
  const bool v_same = fetch(pool[0][1], pool_bytes) == fetch(pool[1][1], pool_bytes);
  std::printf("     new vs old: q_out %s, k pool %s, v pool %s\n", q_same ? "same bits" : "DIFFERENT",
              k_same ? "same bits" : "DIFFERENT", v_same ? "same bits" : "DIFFERENT");
#endif

  unsigned long long* d_bad;
  CHECK(cudaMalloc(&d_bad, 8));
  for (int half = 0; half < 2 && !std::getenv("SKIP_HMUL"); ++half) {  // SKIP_HMUL: variant builds
    CHECK(cudaMemset(d_bad, 0, 8));
    if (half) {
      hmul_check<__half2, __half><<<256, 256>>>(d_bad);
    } else {
      hmul_check<__nv_bfloat162, __nv_bfloat16><<<256, 256>>>(d_bad);
    }
    unsigned long long bad;
    CHECK(cudaMemcpy(&bad, d_bad, 8, cudaMemcpyDeviceToHost));
    std::printf("__hmul2_rn vs fp32 product rounded, %s, all 2^32 pairs: %llu differ\n", half ? "fp16" : "bf16", bad);
  }
  return 0;
}
