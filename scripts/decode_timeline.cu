// Where a decode launch spends its time, block by block: the decode kernel of
// csrc/ops/decode.cu (its tile shapes, tileinfer/decode_tiles.cuh) built with
// TILEINFER_TIMELINE, so thread 0 of every block records the global timer at
//   0 start, 1 metadata read (seq_lens, cu_seqlens_q), 2 first block-table
//   entries read and the previous kernel waited for, 3 first K/V tile landed,
//   4 key loop done (warp 0), 6 every warp's loop done, 7 the warps' parts
//   merged into shared memory, 5 partial written (stores issued).
// No torch, no paging library: a synthetic cache (Qwen3-4B heads 32 / 8, d 128
// unless a case says otherwise, page 64, pages in random order). Prints, per
// context length, the kernel's time and the median / max over blocks of every
// interval. Mode `floor`: kernels that only read the bytes of one sequence at
// 32k positions (contiguous, and as 16-KB chunks in random order), for the
// floor decode stands on. Build and run on the GPU:
//   bash scripts/decode_timeline.sh [quick | floor | bf16-splits | int8-splits]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tileinfer/attention_kernel.cuh"
#include "tileinfer/decode_splits.h"
#include "tileinfer/decode_tiles.cuh"
#include "tileinfer/combine.cuh"

#include "cuda_check.h"

using namespace tileinfer;

constexpr int kHq = 32, kHkv = 8, kD = 128, kPage = 64;

// csrc/ops/decode.cu: DecodeTileSmall (bf16) and DecodeTileInt8Wide / Small at d 128.
using Bf16Tile = DecodeTileSmall<__nv_bfloat16, kD>;
using Int8WideTile = DecodeTileInt8Wide<__nv_bfloat16, kD>;
using Int8SmallTile = DecodeTileSmall<__nv_bfloat16, kD, int8_t>;
using Bf16Tile64 = DecodeTileSmall<__nv_bfloat16, 64>;
using Bf16Tile256 = DecodeTileSmall<__nv_bfloat16, 256>;

// The int8 split rule before 2026-11-29's sixth session: three narrow blocks per SM.
int old_int8_splits(int sms, int seqs) { return std::min(32, std::max(1, 3 * sms / (seqs * kHkv))); }

__global__ void fill_bytes(uint8_t* p, size_t n, uint32_t seed, bool int8) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    // bf16 pairs: a small random value (exponent 0x3c..0x3f); int8: any byte but -128
    p[i] = int8 ? uint8_t(h % 255) : (i & 1 ? uint8_t(0x3c + (h & 3)) : uint8_t(h));
  }
}

// Stands for a kernel of another library before the op: it never lets the
// next kernel start early.
__global__ void idle_kernel() {}

// The read kernels' block timeline (floor mode): thread 0 records the global
// timer at its block's start (i = 0) and end (1), when `stamps` is not null.
__device__ void block_stamp(unsigned long long* stamps, int i) {
  if (stamps == nullptr || threadIdx.x != 0) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  stamps[2 * blockIdx.x + i] = t;
}

// Reads 16-KB chunks (a page of one KV head at d 128, page 64), chunk ids
// [b * per_block, (b + 1) * per_block) of `ids` for block b, four chunks at a
// time (8 loads in flight per thread at 512 threads).
__global__ void read_chunks_kernel(const uint4* __restrict__ p, const int* ids, int per_block, unsigned* out,
                                   unsigned long long* stamps) {
  block_stamp(stamps, 0);
  constexpr int kVecs = 16384 / 16;
  unsigned x = 0;
  for (int c0 = 0; c0 < per_block; c0 += 4) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int c = c0 + u / 2;
      const int j = threadIdx.x + (u % 2) * blockDim.x;
      v[u] = c < per_block && j < kVecs
                 ? __ldcs(p + size_t(ids[blockIdx.x * per_block + c]) * kVecs + j)
                 : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (x == 0x9e3779b9u) *out = x;
  __syncthreads();
  block_stamp(stamps, 1);
}

// Reads `n` 16-byte vectors (a contiguous chunk per block, kUnroll loads in
// flight per thread) and keeps an XOR of them, stored only if it equals a
// value it never takes in practice: the floor of a kernel that only reads
// the bytes decode reads.
template <int kUnroll>
__global__ void read_kernel(const uint4* __restrict__ p, size_t n, unsigned* out,
                            unsigned long long* stamps = nullptr) {
  block_stamp(stamps, 0);
  const size_t per_block = (n + gridDim.x - 1) / gridDim.x;
  const size_t begin = blockIdx.x * per_block;
  const size_t end = begin + per_block < n ? begin + per_block : n;
  unsigned x = 0;
  for (size_t i = begin + threadIdx.x; i < end; i += size_t(kUnroll) * blockDim.x) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t j = i + size_t(u) * blockDim.x;
      v[u] = j < end ? __ldcs(p + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (x == 0x9e3779b9u) *out = x;
  __syncthreads();
  block_stamp(stamps, 1);
}

struct Stats {
  double med, max;
};
static Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.back()};
}

template <class Cfg>
void run(const char* name, int seqs, int len, int sms, bool by_sm = false, int splits_override = 0, bool chain = false,
         bool shuffle = true) {
  constexpr bool kInt8 = Cfg::kInt8;
  constexpr int kD = Cfg::D;
  const int row_bytes = kD * (kInt8 ? 1 : 2);
  const int pages_per_seq = (len + kPage - 1) / kPage;
  const int num_pages = seqs * pages_per_seq;
  const size_t pool_bytes = size_t(num_pages) * kHkv * kPage * row_bytes;
  const int splits = splits_override ? splits_override : int(decode_num_splits_for(sms, seqs, kHkv));

  uint8_t *k, *v;
  CHECK(cudaMalloc(&k, pool_bytes));
  CHECK(cudaMalloc(&v, pool_bytes));
  fill_bytes<<<1024, 256>>>(k, pool_bytes, 1, kInt8);
  fill_bytes<<<1024, 256>>>(v, pool_bytes, 2, kInt8);
  float *k_scale = nullptr, *v_scale = nullptr;
  if (kInt8) {
    const size_t n = size_t(num_pages) * kHkv * kPage;
    std::vector<float> s(n);
    std::mt19937 rng(3);
    for (auto& x : s) x = 0.01f + 0.01f * (rng() % 100) / 100.f;
    CHECK(cudaMalloc(&k_scale, n * 4));
    CHECK(cudaMalloc(&v_scale, n * 4));
    CHECK(cudaMemcpy(k_scale, s.data(), n * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(v_scale, s.data(), n * 4, cudaMemcpyHostToDevice));
  }
  std::vector<int> table(num_pages);
  std::iota(table.begin(), table.end(), 0);
  if (shuffle) std::shuffle(table.begin(), table.end(), std::mt19937(7));
  std::vector<int> lens(seqs, len), cu(seqs + 1);
  for (int i = 0; i <= seqs; ++i) cu[i] = i;
  std::vector<__nv_bfloat16> q(size_t(seqs) * kHq * kD);
  std::mt19937 rng(5);
  for (auto& x : q) x = __float2bfloat16(float(int(rng() % 2001) - 1000) / 1000.f);

  int *d_table, *d_lens, *d_cu;
  __nv_bfloat16* d_q;
  float *d_po, *d_pl;
  CHECK(cudaMalloc(&d_table, table.size() * 4));
  CHECK(cudaMalloc(&d_lens, lens.size() * 4));
  CHECK(cudaMalloc(&d_cu, cu.size() * 4));
  CHECK(cudaMalloc(&d_q, q.size() * 2));
  CHECK(cudaMalloc(&d_po, size_t(splits) * seqs * kHq * kD * 4));
  CHECK(cudaMalloc(&d_pl, size_t(splits) * seqs * kHq * 4));
  CHECK(cudaMemcpy(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_lens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_cu, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_q, q.data(), q.size() * 2, cudaMemcpyHostToDevice));

  AttentionParams p{};
  p.kv = PagedKVParams{k, v, k_scale, v_scale, nullptr, d_table, d_lens, d_cu, seqs, pages_per_seq, num_pages,
                       kHkv, kPage, kD};
  p.q = d_q;
  p.q_stride_token = kHq * kD;
  p.q_stride_head = kD;
  p.partial_out = d_po;
  p.partial_lse = d_pl;
  p.num_tokens = seqs;
  p.num_q_heads = kHq;
  p.group_size = kHq / kHkv;
  p.max_q_len = 1;
  p.num_splits = splits;
  p.scale = 0.0884f;
  p.causal = true;

  auto kernel = attention_tile_kernel<Cfg, DecodeWork>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  const dim3 grid = DecodeWork::grid<Cfg::kBlockM>(p);
  const int blocks = grid.x * grid.y * grid.z;
  if (blocks * 16 > (1 << 20)) {  // tileinfer_timeline's slots (common.cuh)
    std::printf("%s: %d blocks, more than the timeline holds\n", name, blocks);
    std::exit(1);
  }
  const double bytes = 2.0 * seqs * len * kHkv * row_bytes + (kInt8 ? 2.0 * seqs * len * kHkv * 4 : 0.0);

  constexpr int kIters = 50;  // timed launches per figure (time_us, cuda_check.h)
  // The timeline of one launch (the last of a few), intervals in us.
  std::vector<unsigned long long> tl(size_t(blocks) * 16);
  auto timeline = [&](auto launch) {
    std::fill(tl.begin(), tl.end(), 0ull);  // stamps a block never reaches stay 0
    CHECK(cudaMemcpyToSymbol(tileinfer::tileinfer_timeline, tl.data(), tl.size() * 8));
    for (int i = 0; i < 3; ++i) launch();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpyFromSymbol(tl.data(), tileinfer::tileinfer_timeline, tl.size() * 8));
    unsigned long long t0 = ~0ull, t_end = 0;
    for (int b = 0; b < blocks; ++b) {
      t0 = std::min(t0, tl[b * 16]);
      t_end = std::max(t_end, tl[b * 16 + 5]);
    }
    return std::make_pair(t0, (t_end - t0) / 1e3);
  };

  auto decode = [&] { kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes>>>(p); };
  const double t_dec = time_us(decode, kIters);
  const auto [t0, span] = timeline(decode);
  // Intervals between stamps, in the order a block passes them.
  constexpr int kOrder[8] = {0, 1, 2, 3, 4, 6, 7, 5};
  const char* lab[8] = {"", "meta", "ready", "tile0", "loop", "wait", "merge", "store"};
  std::vector<double> d[8], end;
  for (int b = 0; b < blocks; ++b) {
    const unsigned long long* s = &tl[b * 16];
    bool ordered = true;  // blocks without keys skip the loop's stamp (stale)
    for (int i = 1; i < 8; ++i) ordered &= s[kOrder[i]] >= s[kOrder[i - 1]];
    if (!ordered) continue;
    end.push_back((s[5] - t0) / 1e3);
    for (int i = 1; i < 8; ++i) d[i].push_back((double(s[kOrder[i]]) - double(s[kOrder[i - 1]])) / 1e3);
  }
  std::printf("%-6s %3dx%-6d splits %2d blocks %4d | kernel %6.1f us (%4.0f GB/s) span %6.1f |", name, seqs, len,
              splits, blocks, t_dec, bytes / t_dec / 1e3, span);
  for (int i = 1; i < 8; ++i) {
    const Stats s = stats(d[i]);
    std::printf(" %s %.2f/%.2f", lab[i], s.med, s.max);
  }
  const Stats en = stats(end);
  std::printf(" | end med %5.1f max %5.1f (%zu blocks with keys)\n", en.med, en.max, end.size());
  if (by_sm) {
    // Is the spread of loop times tied to the SMs? Per-SM mean loop time in
    // two launches (blocks land on other SMs each time), their correlation,
    // and the loop time by the number of blocks an SM held.
    auto per_sm = [&](std::vector<double>& mean, std::vector<int>& count) {
      mean.assign(sms, 0.0);
      count.assign(sms, 0);
      for (int b = 0; b < blocks; ++b) {
        const unsigned long long* s = &tl[b * 16];
        if (s[3] == 0 || s[4] < s[3]) continue;
        mean[s[8]] += (s[4] - s[3]) / 1e3;
        ++count[s[8]];
      }
      for (int i = 0; i < sms; ++i) mean[i] = count[i] ? mean[i] / count[i] : 0.0;
    };
    std::vector<double> m1, m2;
    std::vector<int> c1, c2;
    per_sm(m1, c1);
    timeline(decode);
    per_sm(m2, c2);
    double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
    int n = 0;
    double by_count[5] = {}, n_count[5] = {};
    for (int i = 0; i < sms; ++i) {
      if (c1[i] && c2[i]) {
        sx += m1[i], sy += m2[i], sxx += m1[i] * m1[i], syy += m2[i] * m2[i], sxy += m1[i] * m2[i];
        ++n;
      }
      if (c1[i] > 0 && c1[i] < 5) by_count[c1[i]] += m1[i], ++n_count[c1[i]];
    }
    const double r = (n * sxy - sx * sy) / std::sqrt((n * sxx - sx * sx) * (n * syy - sy * sy));
    std::printf("       per SM: loop-time correlation between two launches r = %.2f over %d SMs; mean loop by blocks per SM:", r, n);
    for (int c = 1; c < 5; ++c)
      if (n_count[c]) std::printf(" %d: %.1f us (%d SMs)", c, by_count[c] / n_count[c], int(n_count[c]));
    std::printf("\n       per SM mean loop, launch 1 (SM 0..%d):", sms - 1);
    for (int i = 0; i < sms; ++i) std::printf(" %.0f", m1[i]);
    std::printf("\n");
  }
  if (chain) {
    // The attention op's pair of launches, decode then combine, back to back:
    // plain launches against programmatic ones (as the package launches them).
    __nv_bfloat16* out;
    CHECK(cudaMalloc(&out, size_t(seqs) * kHq * kD * 2));
    AttentionParams c = p;
    c.out = out;
    c.o_stride_token = kHq * kD;
    c.o_stride_head = kD;
    c.lse = nullptr;
    auto step = [&](bool pdl) {
      AttentionParams d = p;
      d.programmatic = pdl;  // as launch_attention sets it
      CHECK(launch_kernel(kernel, grid, dim3(Cfg::kThreads), Cfg::kSmemBytes, cudaStream_t(0), pdl, d));
      CHECK((launch_combine<__nv_bfloat16, kD>(c, cudaStream_t(0), pdl)));
    };
    for (bool pdl : {false, true}) {
      const double t = time_us([&] { step(pdl); }, kIters);
      std::printf("       decode + combine, %s launches: %.1f us per step\n", pdl ? "programmatic" : "plain", t);
    }
    {  // the step's output bits, to compare the variants of an A / B run
      std::vector<uint32_t> h(size_t(seqs) * kHq * kD / 2);
      CHECK(cudaDeviceSynchronize());
      CHECK(cudaMemcpy(h.data(), out, h.size() * 4, cudaMemcpyDeviceToHost));
      uint32_t x = 2166136261u;
      for (uint32_t v : h) x = (x ^ v) * 16777619u;
      std::printf("       output hash %08x\n", x);
    }
    const double t_idle = time_us([&] { idle_kernel<<<1, 32>>>(); }, kIters);
    const double t_behind = time_us([&] {
      idle_kernel<<<1, 32>>>();
      step(true);
    }, kIters);
    std::printf("       decode + combine, programmatic, each behind an empty kernel that does not trigger: %.1f us per"
                " step (the empty kernel alone: %.1f us)\n", t_behind, t_idle);
    CHECK(cudaFree(out));
  }
  for (void* ptr : {(void*)k, (void*)v, (void*)k_scale, (void*)v_scale, (void*)d_table, (void*)d_lens, (void*)d_cu,
                    (void*)d_q, (void*)d_po, (void*)d_pl})
    if (ptr) CHECK(cudaFree(ptr));
}

int main(int argc, char** argv) {
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // Copy bandwidth of the same order of bytes (read + write), for scale.
  {
    const size_t n = size_t(64) << 20;
    void *a, *b;
    CHECK(cudaMalloc(&a, n));
    CHECK(cudaMalloc(&b, n));
    const double t = time_us([&] { CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice)); }, 50);
    std::printf("copy 64 MiB: %.1f us, %.0f GB/s (read + write)\n", t, 2.0 * n / t / 1e3);
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
  }
  std::printf("intervals: med/max over blocks, us (meta: start -> metadata read, first table entries asked for;"
              " ready: -> first lookups done and the previous kernel waited for; tile0: -> first tile landed;"
              " loop: -> keys done; wait / merge / store: the epilogue's steps)\n");
  if (argc > 1 && std::string(argv[1]) == "bf16-splits") {
    // One sequence with more splits than two blocks per SM (second-wave blocks
    // go to the SMs that finish first): the cap of 32 against 48 and 64.
    for (int len : {1024, 4096, 8192, 32768})
      for (int splits : {32, 48, 64}) run<Bf16Tile>("bf16", 1, len, sms, false, splits, true);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "int8-splits") {
    // The int8 split rule: splits for three narrow blocks per SM (before
    // 2026-11-29's session 6) against two wide ones (now), at 32k positions.
    for (int seqs : {2, 4, 8, 16}) {
      run<Int8SmallTile>("int8s", seqs, 32768, sms, false, old_int8_splits(sms, seqs), true);
      run<Int8WideTile>("int8w", seqs, 32768, sms, false, 0, true);
    }
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "floor") {
    // What a kernel that only reads 1 x 32k's K and V (134 MB) takes,
    // launched back to back the ordinary way (as "kernel" below).
    const size_t bytes = size_t(2) * 32768 * kHkv * kD * 2;
    uint4* buf;
    unsigned* sink;
    CHECK(cudaMalloc(&buf, bytes));
    CHECK(cudaMalloc(&sink, 4));
    fill_bytes<<<1024, 256>>>(reinterpret_cast<uint8_t*>(buf), bytes, 9, false);
    const size_t n = bytes / 16;
    for (int blocks : {sms, 2 * sms, 4 * sms, 8 * sms})
      for (int threads : {256, 512}) {
        const double t8 = time_us([&] { read_kernel<8><<<blocks, threads>>>(buf, n, sink); }, 50);
        const double t4 = time_us([&] { read_kernel<4><<<blocks, threads>>>(buf, n, sink); }, 50);
        std::printf("read only, %zu MB, %4d blocks x %3d threads: %.1f us (%.0f GB/s) with 8 loads in flight per"
                    " thread, %.1f us with 4\n", bytes >> 20, blocks, threads, t8, bytes / t8 / 1e3, t4);
      }
    // Block start / end of two shapes, as the decode timeline's: is the
    // uneven end across SMs there too?
    unsigned long long* st;
    CHECK(cudaMalloc(&st, size_t(16) * sms * 16));
    auto spread = [&](const char* what, int blocks, auto launch) {
      for (int i = 0; i < 3; ++i) launch();
      CHECK(cudaDeviceSynchronize());
      std::vector<unsigned long long> s(size_t(2) * blocks);
      CHECK(cudaMemcpy(s.data(), st, s.size() * 8, cudaMemcpyDeviceToHost));
      unsigned long long t0 = ~0ull;
      for (int b = 0; b < blocks; ++b) t0 = std::min(t0, s[2 * b]);
      std::vector<double> start, end;
      for (int b = 0; b < blocks; ++b) {
        start.push_back((s[2 * b] - t0) / 1e3);
        end.push_back((s[2 * b + 1] - t0) / 1e3);
      }
      const Stats a = stats(start), e = stats(end);
      std::sort(end.begin(), end.end());
      std::printf("read only, %s: block start med %.2f max %.2f | end min %.1f med %.1f max %.1f us (from the"
                  " first block's start)\n", what, a.med, a.max, end.front(), e.med, e.max);
    };
    spread("264 blocks x 512 threads, 8 loads each", 2 * sms,
           [&] { read_kernel<8><<<2 * sms, 512>>>(buf, n, sink, st); });
    spread("256 blocks x 128 threads, 32 loads each (decode's 64 KB in flight per block)", 256,
           [&] { read_kernel<32><<<256, 128>>>(buf, n, sink, st); });
    // The same bytes as 16-KB chunks in random order (the paged K and V of
    // one KV head: decode_timeline's cache), 256 blocks of 2 x 256 chunks.
    const int chunks = int(bytes / 16384);
    std::vector<int> ids(chunks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(11));
    int* d_ids;
    CHECK(cudaMalloc(&d_ids, chunks * 4));
    CHECK(cudaMemcpy(d_ids, ids.data(), chunks * 4, cudaMemcpyHostToDevice));
    spread("256 blocks x 512 threads, 16-KB chunks in random order", 256,
           [&] { read_chunks_kernel<<<256, 512>>>(buf, d_ids, chunks / 256, sink, st); });
    std::printf("read only, 256 blocks x 512 threads, 16-KB chunks in random order: %.1f us\n",
                time_us([&] { read_chunks_kernel<<<256, 512>>>(buf, d_ids, chunks / 256, sink, st); }, 50));
    CHECK(cudaFree(d_ids));
    CHECK(cudaFree(st));
    CHECK(cudaFree(buf));
    CHECK(cudaFree(sink));
    run<Bf16Tile>("bf16", 1, 32768, sms, false, 0, true);
    std::printf("  (pages in order:)\n");
    run<Bf16Tile>("bf16", 1, 32768, sms, false, 0, true, false);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "quick") {
    // A / B runs of kernel changes: the cases that moved in the past.
    for (int len : {1024, 8192, 32768}) run<Bf16Tile>("bf16", 1, len, sms, false, 0, len == 32768);
    run<Bf16Tile>("bf16", 8, 32768, sms, false, 0, true);
    run<Bf16Tile>("bf16", 32, 4096, sms, false, 0, true);
    run<Int8WideTile>("int8w", 1, 32768, sms, false, 0, true);
    for (int seqs : {1, 32}) {  // the other head dims
      run<Bf16Tile64>("bf16d64", seqs, seqs == 1 ? 32768 : 4096, sms, false, 0, true);
      run<Bf16Tile256>("bf16d256", seqs, seqs == 1 ? 32768 : 4096, sms, false, 0, true);
    }
    return 0;
  }
  for (int len : {1024, 8192, 32768, 131072}) run<Bf16Tile>("bf16", 1, len, sms, false, 0, len == 32768);
  run<Bf16Tile>("bf16", 8, 32768, sms, true, 0, true);
  run<Bf16Tile>("bf16", 32, 4096, sms);
  for (int len : {8192, 32768, 131072}) run<Int8WideTile>("int8w", 1, len, sms, false, 0, len == 32768);
  run<Int8WideTile>("int8w", 32, 4096, sms, false, 0, true);
  run<Int8SmallTile>("int8s", 8, 32768, sms, true, old_int8_splits(sms, 8), true);  // the old rule
  run<Int8WideTile>("int8w", 8, 32768, sms, true, 0, true);
  return 0;
}
