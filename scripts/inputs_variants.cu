// Experiment: the queries kernel of attention_inputs (rows_kernel: q RMSNorm +
// RoPE, Qwen3-4B shapes, bf16, d 128, 32 query heads out of a packed qkv of
// 48 heads) against variants, on one prefill-sized step (4096 tokens, one
// sequence). Each variant's output is compared bit for bit with rows_kernel's.
//   V0  rows_kernel as the package launches it (one 32-row block per token)
//   V1  one wave of blocks (or two), each walking tokens gridDim apart, the
//       next 0-2 tokens' row loads in flight while it works on the current
//       one; some with a register cap for more blocks per SM
// No torch. Build and run on the GPU: bash scripts/inputs_variants.sh
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "tileinfer/inputs.cuh"

#include "cuda_check.h"

using namespace tileinfer;

using T = __nv_bfloat16;
constexpr int kD = 128, kHq = 32, kHkv = 8, kHeads = kHq + 2 * kHkv;

template <typename TT, int D, bool NORM, int kAhead, int kMinBlocks>
__global__ void __launch_bounds__(kInputsThreads, kMinBlocks) rows_one_wave(const RowsParams p) {
  wait_for_prior_grids();
  allow_dependent_launch();
  using L = RowLayout<TT, D>;
  const int group = threadIdx.x / L::kLanes;
  const int lane = threadIdx.x % L::kLanes;
  const int64_t total = static_cast<int64_t>(p.num_tokens) * p.num_heads;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * L::kGroups;
  __shared__ __align__(16) float rows[L::kGroups][D];
  // Raw rows in flight: slot s holds row r + s * stride.
  Vec16<TT> raw[kAhead + 1][L::kVecs];
  auto fetch = [&](int64_t r, Vec16<TT> (&v)[L::kVecs]) {
    if (r >= total) return;
    const int token = static_cast<int>(r / p.num_heads), head = static_cast<int>(r % p.num_heads);
    const TT* src = static_cast<const TT*>(p.x) + token * p.x_stride_token + head * p.x_stride_head;
#pragma unroll
    for (int i = 0; i < L::kVecs; ++i) v[i] = *reinterpret_cast<const Vec16<TT>*>(src + L::col(lane, i));
  };
  int64_t r = static_cast<int64_t>(blockIdx.x) * L::kGroups + group;
#pragma unroll
  for (int s = 0; s < kAhead; ++s) fetch(r + s * stride, raw[s]);
  for (; r < total; r += stride) {
    fetch(r + kAhead * stride, raw[kAhead]);
    const int token = static_cast<int>(r / p.num_heads), head = static_cast<int>(r % p.num_heads);
    int seq;
    const int64_t pos = token_position(p.kv, token, &seq);
    float x[L::kElems];
#pragma unroll
    for (int i = 0; i < L::kVecs; ++i)
#pragma unroll
      for (int e = 0; e < L::kVec; ++e) x[i * L::kVec + e] = to_float(raw[0][i].v[e]);
    const bool write = pos >= 0 && pos < p.rope.max_position;
    if constexpr (NORM) rms_norm_stage<TT, D>(x, static_cast<const TT*>(p.weight), p.eps, lane);
    rope_stage<TT, D>(x, rows[group], write ? p.rope.cos_sin + pos * p.rope.stride : nullptr, p.rope, lane);
    if (write)
      store_row<TT, D>(static_cast<TT*>(p.out) + token * p.out_stride_token + head * p.out_stride_head, x, lane);
#pragma unroll
    for (int s = 0; s < kAhead; ++s)
#pragma unroll
      for (int i = 0; i < L::kVecs; ++i) raw[s][i] = raw[s + 1][i];
  }
}

int main() {
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int tokens = 4096, max_pos = 8192;
  std::mt19937 rng(1);
  std::vector<T> qkv(size_t(tokens) * kHeads * kD), w(kD);
  for (auto& v : qkv) v = __float2bfloat16(float(int(rng() % 2001) - 1000) / 500.f);
  for (auto& v : w) v = __float2bfloat16(0.5f + float(rng() % 1000) / 1000.f);
  std::vector<float> cs(size_t(max_pos) * kD);
  for (int pos = 0; pos < max_pos; ++pos)
    for (int c = 0; c < kD / 2; ++c) {
      const double a = pos * std::pow(1e6, -2.0 * c / kD);
      cs[size_t(pos) * kD + c] = float(std::cos(a));
      cs[size_t(pos) * kD + kD / 2 + c] = float(std::sin(a));
    }
  const int seq_lens[1] = {tokens}, cu[2] = {0, tokens};

  T *d_qkv, *d_w, *d_out0, *d_out1;
  float* d_cs;
  int *d_lens, *d_cu;
  const size_t out_bytes = size_t(tokens) * kHq * kD * 2;
  CHECK(cudaMalloc(&d_qkv, qkv.size() * 2));
  CHECK(cudaMalloc(&d_w, kD * 2));
  CHECK(cudaMalloc(&d_out0, out_bytes));
  CHECK(cudaMalloc(&d_out1, out_bytes));
  CHECK(cudaMalloc(&d_cs, cs.size() * 4));
  CHECK(cudaMalloc(&d_lens, 4));
  CHECK(cudaMalloc(&d_cu, 8));
  CHECK(cudaMemcpy(d_qkv, qkv.data(), qkv.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_w, w.data(), kD * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_cs, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_lens, seq_lens, 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_cu, cu, 8, cudaMemcpyHostToDevice));

  RowsParams p{};
  p.x = d_qkv;
  p.x_stride_token = kHeads * kD;
  p.x_stride_head = kD;
  p.out = d_out0;
  p.out_stride_token = kHq * kD;
  p.out_stride_head = kD;
  p.weight = d_w;
  p.eps = 1e-6f;
  p.rope = RopeTable{d_cs, kD, max_pos, kD, true};
  p.kv.seq_lens = d_lens;
  p.kv.cu_seqlens_q = d_cu;
  p.kv.num_seqs = 1;
  p.num_tokens = tokens;
  p.num_heads = kHq;

  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  auto time_us = [&](auto launch) {
    for (int i = 0; i < 5; ++i) launch();
    CHECK(cudaEventRecord(e0));
    for (int i = 0; i < 100; ++i) launch();
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return 1e3 * ms / 100;
  };
  const double bytes = 2.0 * out_bytes;  // q rows read + written
  using L = RowLayout<T, kD>;
  const int v0_blocks = tokens * kHq / L::kRowsPerBlock;
  const double t0 = time_us([&] {
    rows_kernel<T, kD, true, PosFrom::kMetadata><<<v0_blocks, kInputsThreads>>>(p);
  });
  std::printf("V0 rows_kernel        %5d blocks: %6.1f us, %5.0f GB/s\n", v0_blocks, t0, bytes / t0 / 1e3);
  std::vector<uint8_t> ref(out_bytes), got(out_bytes);
  CHECK(cudaMemcpy(ref.data(), d_out0, out_bytes, cudaMemcpyDeviceToHost));
  // The same kernel with fewer stages: how much of the time is the work (into
  // another buffer). And with explicit positions (the rope op's way: one load
  // instead of the metadata search), which must give the same bits.
  RowsParams scratch = p;
  scratch.out = d_out1;
  std::vector<int> positions(tokens);
  for (int t = 0; t < tokens; ++t) positions[t] = t;  // seq_len - q_count + t, one sequence
  int* d_pos;
  CHECK(cudaMalloc(&d_pos, tokens * 4));
  CHECK(cudaMemcpy(d_pos, positions.data(), tokens * 4, cudaMemcpyHostToDevice));
  scratch.positions = d_pos;
  const double t_norope = time_us([&] { rows_kernel<T, kD, true, PosFrom::kNone><<<v0_blocks, kInputsThreads>>>(scratch); });
  const double t_nonorm = time_us([&] { rows_kernel<T, kD, false, PosFrom::kMetadata><<<v0_blocks, kInputsThreads>>>(scratch); });
  const double t_copy = time_us([&] { rows_kernel<T, kD, false, PosFrom::kNone><<<v0_blocks, kInputsThreads>>>(scratch); });
  std::printf("   same kernel, norm only: %.1f us; rope only: %.1f us; neither (a copy of the rows): %.1f us (%.0f GB/s)\n",
              t_norope, t_nonorm, t_copy, bytes / t_copy / 1e3);
  const double t_pos = time_us([&] { rows_kernel<T, kD, true, PosFrom::kInt32><<<v0_blocks, kInputsThreads>>>(scratch); });
  std::vector<uint8_t> pos_out(out_bytes);
  CHECK(cudaMemcpy(pos_out.data(), d_out1, out_bytes, cudaMemcpyDeviceToHost));
  std::printf("   explicit positions: %.1f us (%s)\n", t_pos,
              std::memcmp(ref.data(), pos_out.data(), out_bytes) == 0 ? "same bits" : "DIFFERENT");

  auto variant = [&](const char* name, auto kernel) {
    int per_sm;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kInputsThreads, 0));
    for (int waves : {1, 2}) {
      const int blocks = std::min(v0_blocks, per_sm * sms * waves);
      RowsParams q = p;
      q.out = d_out1;
      CHECK(cudaMemset(d_out1, 0xff, out_bytes));
      const double t = time_us([&] { kernel<<<blocks, kInputsThreads>>>(q); });
      CHECK(cudaMemcpy(got.data(), d_out1, out_bytes, cudaMemcpyDeviceToHost));
      std::printf("%-20s %5d blocks (%d per SM x %d): %6.1f us, %5.0f GB/s, %s\n", name, blocks, per_sm, waves, t,
                  bytes / t / 1e3, std::memcmp(ref.data(), got.data(), out_bytes) == 0 ? "same bits" : "DIFFERENT");
    }
  };
  variant("V1 one wave, ahead 0", rows_one_wave<T, kD, true, 0, 1>);
  variant("V1 one wave, ahead 1", rows_one_wave<T, kD, true, 1, 1>);
  variant("V1 ahead 1, 5 blk/SM", rows_one_wave<T, kD, true, 1, 5>);
  variant("V1 one wave, ahead 2", rows_one_wave<T, kD, true, 2, 1>);
  variant("V1 ahead 2, 4 blk/SM", rows_one_wave<T, kD, true, 2, 4>);
  return 0;
}
