// CUDA implementation of `prefill`. Which kernel runs, from shapes and the
// device only:
//   Hopper, bf16 / fp16 cache   the warp-specialized kernel (sm90/prefill_kernel.cuh)
//   Hopper, int8 / fp8 cache, d <= 128: the warp-specialized kernel with its
//                               converter warps
//   other quantized cases, other GPUs  the mma.sync tile kernel (attention_kernel.cuh)
//   fp32                        the CUDA-core kernel (attention_fp32.cuh)
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <functional>
#include <optional>
#include <type_traits>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "attention_host.h"
#include "checks.h"
#include "device_attribute.h"
#include "ops.h"
#include "tensor_map.h"
#include "tileinfer/sm90/prefill_kernel.cuh"
#include "tileinfer/sm90/prefill_own_kv.cuh"
#include "tileinfer/sm90/prefill_scale_range.cuh"
#include "tileinfer/dispatch.h"

namespace tileinfer::cuda {
namespace {

// The mma.sync tile kernel (fp32 excepted: attention_fp32.cuh) serves
// prefill where the Hopper kernel does not: other GPUs, quantized caches at d
// 256 or with per-vector scale tensors off a 16-byte boundary. Two tile
// shapes, 4 warps each:
// - 64-row tiles: 16 rows per warp, Q fragments in registers, keys 64 at a time,
//   two stages (the other resident block's math hides each block's copies).
//   Twice the blocks of the 128-row tile, so short prompts fill the SMs. Also
//   d = 256, whose 128-register accumulator leaves room for a 32-key S slice only.
// - 128-row tiles: 32 rows per warp, so each K / V fragment read from shared
//   memory feeds two mma row tiles (half the ldmatrix traffic per mma); Q is
//   re-read from shared memory per tile. 32-key tiles keep it within 255
//   registers without spills, three stages, two blocks per SM. d <= 128.
// - int8 / fp8 cache: the same two shapes (integer or fp16 scores, fp16 P V;
//   the 128-row tile converts each V tile once for twice the rows); the
//   quantized stages are half the bytes, so the 64-row tile keeps three of
//   them at d <= 128.
template <typename T, int D, typename CacheT = T>
using PrefillTileSmall = TileConfig<TileElement<T, CacheT>, D, 4, 1, 1, (D == 256 ? 32 : 64),
                                    (kQuantized<CacheT> && D <= 128 ? 3 : 2), CacheT, T>;
template <typename T, int D, typename CacheT = T>
using PrefillTileLarge = TileConfig<TileElement<T, CacheT>, D, 4, 1, 2, 32, 3, CacheT, T>;

// The tiles of a quantized (int8 / fp8) cache for queries of type T: a
// function template, so that `if constexpr` keeps fp32 queries (never taken
// with a quantized cache: checked) from instantiating them.
template <typename T, int D>
void launch_prefill_quant(const char* op, const AttentionParams& p, const PagedShape& s, bool large,
                          cudaStream_t stream) {
  if constexpr (!std::is_same_v<T, float>) {
    TILEINFER_DISPATCH_QUANT(s.cache_dtype, op, [&] {
      if constexpr (D <= 128) {
        if (large) return launch_tile<PrefillTileLarge<T, D, cache_t>, PrefillWork>(op, p, stream);
      }
      launch_tile<PrefillTileSmall<T, D, cache_t>, PrefillWork>(op, p, stream);
    });
  }
}

// Shapes only (the same choice on every call of a captured graph): the
// 128-row tile pays from about 2048 queries on, where the 64-row tile's extra
// blocks no longer help to fill the GPU.
bool use_large_prefill_tile(int64_t max_q_len, int64_t head_dim) { return head_dim <= 128 && max_q_len >= 2048; }

bool is_hopper(int device) {
  return cached_device_attribute<cudaDevAttrComputeCapabilityMajor>(device) == 9 &&
         cached_device_attribute<cudaDevAttrComputeCapabilityMinor>(device) == 0;
}

// The query heads of a work item of the warp-specialized kernel
// (sm90/prefill_tile.h, PrefillParams::item_group). It copies an item's query
// tile as one box of {heads x kBlockM / heads tokens}, so the heads must
// divide kBlockM: a group that is a power of two dividing kBlockM (128, or
// 192 with three consumers: up to 128 or 64 heads) packs a KV
// head's whole group into an item (its queries share every key tile); other
// groups (28/4 = 7, 40/8 = 5) take an item per query head, each item copying
// its KV head's pages. TILEINFER_PREFILL_PER_HEAD=1 gives every group an
// item per query head, to measure packing against it (docs/PERFORMANCE.md,
// "Prefill"); read at each call, as the mixed steps'
// TILEINFER_MIXED_DECODE_SMS, so a captured graph keeps its capture's value.
int prefill_item_group(int group, int block_m) {
  if (env_switch("TILEINFER_PREFILL_PER_HEAD", "0", "1", false)) return 1;
  return group > 0 && (group & (group - 1)) == 0 && block_m % group == 0 ? group : 1;
}

// d 64 over a cache of the queries' type: work items of 192 rows for three
// consumer warpgroups (sm90/prefill_tile.h) where the step has at least two
// of them per SM. Counted from shapes: every sequence at max_q_len, but no
// more row tiles than the step's tokens fill (a mixed step of `attention`
// counts its decodes' tokens, not a prompt each). Fewer and larger items
// leave SMs idle on short prompts: 1 x 512 at 32 / 8 heads has 88 items of
// 192 rows for 132 SMs (128 of 128 rows) and takes ~1.2x the two-consumer
// time, while 1 x 8k takes 0.88-0.92x of it (H100, docs/PERFORMANCE.md,
// "Prefill"). A sliding window of fewer than kThreeConsumerMinWindow keys
// keeps two consumers: its items see a few key tiles, each masked, and the
// three-consumer kernel spills in the masked-tile branch (gpt-oss's 128-key
// window: 1.07-1.09x the two-consumer time at 1 x 8k, 1.08-1.14x at 1 x 2k;
// the crossover sits near 1024 keys). A batch-invariant step keeps two
// consumers, so that its item rows do not follow the batch.
// TILEINFER_PREFILL_CONSUMERS=2 or 3 puts every other d 64 step on that
// kernel instead, for a measurement (read at each call, as
// TILEINFER_PREFILL_PER_HEAD).
constexpr int kThreeConsumerMinWindow = 1024;

bool prefill_three_consumers(const AttentionParams& a, bool batch_invariant, int sms) {
  if (batch_invariant) return false;
  if (std::getenv("TILEINFER_PREFILL_CONSUMERS") != nullptr)
    return env_switch("TILEINFER_PREFILL_CONSUMERS", "2", "3", false);
  if (a.window_left < kThreeConsumerMinWindow) return false;
  const int group = prefill_item_group(a.group_size, 192);
  const int64_t by_seqs = int64_t(a.kv.num_seqs) * ceil_div<int64_t>(int64_t(group) * a.max_q_len, 192);
  const int64_t by_tokens = ceil_div<int64_t>(int64_t(group) * a.num_tokens, 192);
  return (a.num_q_heads / group) * std::min(by_seqs, by_tokens) >= 2 * int64_t(sms);
}

// TILEINFER_PREFILL_KERNEL=tile runs the mma.sync tile kernel wherever the
// Hopper kernel would run, so that a Hopper machine tests (and times) the
// prefill other GPUs run; unset or "auto", the rule below. Read at each call,
// as TILEINFER_PREFILL_PER_HEAD.
bool tile_kernel_forced() { return env_switch("TILEINFER_PREFILL_KERNEL", "auto", "tile", false); }

// TILEINFER_PREFILL_OWN_KV=0 takes every tile of a quantized cache's prefill
// through the converter warps, without the pass that turns the step's own
// keys and values into fp16 first (sm90/prefill_own_kv.cuh; the same bits),
// to measure what the pass gives; read at each call.
bool own_kv_pass() { return env_switch("TILEINFER_PREFILL_OWN_KV", "0", "1", true); }

// The Hopper kernel needs bf16 / fp16 queries and a 9.0 device of a build
// with sm_90a code (setup.py defines TILEINFER_SM90A then; without that code
// the kernel would trap). Over a quantized cache (int8, fp8), its converters
// take tile dims up to 128, and per-vector scales whose tensors start 16-byte
// aligned (the bulk copies' unit; an offset view takes the tile kernel), as
// must k_smooth (the consumers load it 16 bytes at a time).
bool use_hopper_prefill(const PagedShape& s, at::ScalarType dtype, int device, const AttentionParams& p) {
  const bool forced_tile = tile_kernel_forced();  // (its value checked on every build)
#ifdef TILEINFER_SM90A
  if (forced_tile) return false;
  if (dtype != at::ScalarType::BFloat16 && dtype != at::ScalarType::Half) return false;
  if (!is_hopper(device)) return false;
  if (s.quantized) {
    if (tile_head_dim(s.head_dim) > 128) return false;
    const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
    if (!s.scale_per_tensor && !(aligned(p.kv.k_scale) && aligned(p.kv.v_scale))) return false;
    if (!aligned(p.kv.k_smooth)) return false;  // (nullptr: aligned)
  }
  return true;
#else
  (void)forced_tile;
  return false;
#endif
}

// Mixed steps beside their decodes. A mixed step's two parts need different
// things: its prompt chunks the tensor cores, its decodes the memory. Run one
// after the other, as they must be when a kernel takes every SM, the step
// costs the sum of the parts. The warp-specialized kernel takes a whole SM per
// block (every register, 161-193 KB of shared memory), so no decode block
// fits beside one; instead the step leaves D of the SMs to the decodes at the
// start:
//   this stream:  prefill, grid - D blocks, at a higher priority (placed first;
//                 eager launches only: PyTorch's graphs ignore node priorities)
//   side stream:  a gate until those blocks have started (sm90::hand_out_gate),
//                 decode (+ combine), then prefill again, D blocks
// Both prefill launches take their items from one counter at run time
// (prefill_scheduler.cuh), so the second launch, on the SMs the decodes give
// back, takes whatever is left; the decodes, bandwidth-bound, read with D SMs
// most of what they read with all of them while the chunks compute, and
// spread over the prefill's SMs as those run out of items. Nothing depends on
// the mix: a step without decodes starts the second launch after two empty
// kernels, and one without chunks leaves its prefill launches no item.
// Over a quantized cache the passes before the kernel (the scale range, the
// step's own keys and values) are enqueued before the fork, so both launches
// find them done, and the converter warps take each item from the producer
// as the consumers do (prefill_convert.cuh), whichever way it came.
// D: 16 / 33 of the SMs (64 of an H100's or H200's 132), the count that gave
// the 2k-chunk step of docs/PERFORMANCE.md its lowest time, for a step of two
// sequences or more; a single sequence is all chunk or all decode, and runs
// in turn (on the static order, which its prompts keep). The hand-out also
// balances prompt batches better than the mixed steps' static order
// (sequence by sequence): 16 x 1k through `attention` 0.75-0.78x the time in turn.
// A launch whose items need fewer than 2 D blocks runs the parts one after the
// other too. TILEINFER_MIXED_DECODE_SMS=D (read at each call, so a captured
// graph keeps the value of its capture) sets D instead, 0 for the parts in
// turn.
// In turn, the decodes go on the side stream too, launched after the whole
// prefill grid: they take the SMs it leaves idle (a lone 512-token prompt's
// 128 items leave 4 of 132) or frees as its blocks end, instead of running
// before it. That hides most of a lone prompt's empty decode and combine
// launches (1 x 512 through `attention` 19.7-19.8 -> 18.3-18.7 us, prefill
// op 13.8) and overlaps a mixed step's decodes with its prefill's last
// blocks (2k chunk + 64 decodes in turn 544-545 -> 526-528 us; H100s).
int decode_sms(int sms, int64_t num_seqs) {
  return static_cast<int>(env_int("TILEINFER_MIXED_DECODE_SMS", 0, sms - 1, num_seqs >= 2 ? sms * 16 / 33 : 0));
}

// TILEINFER_MIXED_GATE=0 starts the decodes without waiting for the first
// prefill launch's blocks (sm90::hand_out_gate), to measure what the gate
// gives (docs/PERFORMANCE.md, "Mixed steps"); read at each call.
bool gate_decodes() { return env_switch("TILEINFER_MIXED_GATE", "0", "1", true); }

// TILEINFER_MIXED_SIDE_STREAM=0 launches the decodes of a step in turn
// before its prefill, on the caller's stream, to measure what the side
// stream gives there (above); read at each call.
bool decodes_on_side_stream() { return env_switch("TILEINFER_MIXED_SIDE_STREAM", "0", "1", true); }

// A side stream other than the caller's. The pool hands its streams out in
// turn, and a caller's stream from the same pool (as torch.cuda.Stream()
// gives, and graph captures often run on) comes back once a round: the fork
// then orders the branches one after the other, and a mixed step's first
// launch takes every item on grid - D SMs before the second starts (4 x 1k
// chunks at 8k positions: 1487 us against 882 in turn, one H100).
c10::cuda::CUDAStream side_stream(cudaStream_t stream, int device) {
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device);
  return side.stream() == stream ? c10::cuda::getStreamFromPool(false, device) : side;
}

// `side` waits for `main`'s work so far; join() makes `main` wait for
// `side`'s. Events without timing, as CUDA graph capture takes them (a fork
// and a join of the captured streams).
class StreamFork {
 public:
  StreamFork(cudaStream_t main, cudaStream_t side) : main_(main), side_(side) {
    C10_CUDA_CHECK(signal(main_, side_));
  }
  void join() {
    joined_ = true;
    C10_CUDA_CHECK(signal(side_, main_));
  }
  // An error between fork and join: join anyway (a capture must end joined).
  ~StreamFork() {
    if (!joined_) (void)signal(side_, main_);
  }

 private:
  static cudaError_t signal(cudaStream_t from, cudaStream_t to) {
    cudaEvent_t e;
    cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (err != cudaSuccess) return err;
    err = cudaEventRecord(e, from);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(to, e, 0);
    const cudaError_t destroyed = cudaEventDestroy(e);  // released once recorded
    return err != cudaSuccess ? err : destroyed;
  }
  cudaStream_t main_, side_;
  bool joined_ = false;
};

// One launch of the warp-specialized kernel, as `kHandOut` says it takes
// its items (prefill_kernel.cuh), with its soft-capped scores against a fixed
// offset where the kernel's P has the range for it (softmax.cuh,
// fixed_offset), and a quantized cache's uncapped steps on the kernel
// without the tanh (prefill_consumer.cuh). Each instantiation opts in to
// its shared memory once.
template <class Cfg, bool kHandOut, sm90::CapForm kCap = sm90::CapForm::kAny>
cudaError_t launch_prefill_kernel(int priority, dim3 grid, cudaStream_t stream, const sm90::PrefillParams& p) {
  using sm90::CapForm;
  if constexpr (kCap == CapForm::kAny && Cfg::kFixedOffsetFits) {
    if (fixed_offset_fits(p.a.soft_cap))
      return launch_prefill_kernel<Cfg, kHandOut, CapForm::kFixedOffset>(priority, grid, stream, p);
  }
  if constexpr (kCap == CapForm::kAny && Cfg::kQuant) {
    // (ScoreMap::make's test for a cap, softmax.cuh.)
    if (!(p.a.soft_cap > 0.f)) return launch_prefill_kernel<Cfg, kHandOut, CapForm::kNone>(priority, grid, stream, p);
  }
  constexpr auto kernel = sm90::prefill_kernel<Cfg, kHandOut, kCap>;
  static SmemOptIn opt_in;
  opt_in.ensure(kernel, Cfg::kSmemBytes);
  return launch_kernel_ex(priority, 1, kernel, grid, dim3(Cfg::kThreads), Cfg::kSmemBytes, stream, p.a.programmatic,
                          p);
}

// Per-vector scales: the largest |k_scale| and |v_scale| of each (sequence,
// KV head), from one pass enqueued before the kernel, a block per pair
// (sm90/prefill_scale_range.cuh), set in p. Allocated on `stream`.
at::Tensor launch_scale_range(sm90::PrefillParams& p, const at::Tensor& q, cudaStream_t stream) {
  const AttentionParams& a = p.a;
  const int64_t pairs = int64_t(a.kv.num_seqs) * a.kv.num_kv_heads;
  at::Tensor top = at::empty({std::max<int64_t>(pairs, 1), 2}, q.options().dtype(at::kInt));
  p.scale_top = reinterpret_cast<const uint2*>(top.data_ptr<int>());
  if (pairs > 0)
    C10_CUDA_CHECK(launch_kernel(sm90::prefill_scale_range, dim3(unsigned(pairs)), dim3(sm90::kScaleRangeThreads), 0,
                                 stream, a.programmatic, a, reinterpret_cast<uint2*>(top.data_ptr<int>())));
  return top;
}

// Room for prefix rows (sm90/prefill_own_kv.cuh): the cached prefixes of
// chunks that a step's own-keys pass turns into fp16 with the step's
// tokens, so that the kernel copies those tiles as over a 16-bit cache
// instead of converting each one once per work item. At most
// TILEINFER_PREFILL_PREFIX_MB MiB of fp16 keys and values (default 128, 0
// for none; read at each call, so a captured graph keeps the room of its
// capture), and no more than the block tables can address; none under a
// window (most positions would be left unread) or past sm90::kPrefixSeqs
// sequences. The pass's grid is sized for the room: a short chunk's tokens
// give too few blocks for its prefix (docs/PERFORMANCE.md).
int64_t prefix_room(const AttentionParams& a) {
  const int64_t mb = env_int("TILEINFER_PREFILL_PREFIX_MB", 0, int64_t(1) << 20, 128);
  if (a.window_left != INT_MAX || a.kv.num_seqs > sm90::kPrefixSeqs || a.kv.num_seqs == 0) return 0;
  const int64_t row_bytes = int64_t(4) * a.kv.num_kv_heads * a.kv.head_dim;  // fp16 keys and values
  const int64_t addressed = int64_t(a.kv.num_seqs) * a.kv.max_pages * a.kv.page_size;
  return std::min<int64_t>({(mb << 20) / row_bytes, addressed, INT_MAX - int64_t(a.num_tokens)});
}

// The step's own keys and values of a quantized cache in fp16 (rows of
// tokens, as q, then prefix rows), from one pass over its tokens enqueued
// before the kernel (sm90/prefill_own_kv.cuh), with the maps, flag and
// prefix bases the producer reads set in p. Allocated on `stream`, where the
// kernel runs.
struct OwnKv {
  at::Tensor k, v, ok, pre_base;
};
template <class Cfg>
OwnKv launch_own_kv(sm90::PrefillParams& p, const at::Tensor& q, int sms, cudaStream_t stream) {
  const AttentionParams& a = p.a;
  const int64_t hd = a.kv.head_dim;
  const int64_t room = prefix_room(a);
  const int64_t rows = a.num_tokens + room;
  OwnKv own;
  own.k = at::empty({rows, a.kv.num_kv_heads, hd}, q.options().dtype(at::kHalf));
  own.v = at::empty_like(own.k);
  own.ok = at::empty({1}, q.options().dtype(at::kInt));
  if (room > 0) own.pre_base = at::empty({a.kv.num_seqs}, q.options().dtype(at::kInt));
  const uint64_t sizes[3] = {uint64_t(hd), uint64_t(a.kv.num_kv_heads), uint64_t(rows)};
  const uint64_t strides[2] = {uint64_t(hd) * 2, uint64_t(hd) * 2 * a.kv.num_kv_heads};
  const uint32_t box[3] = {64u, 1u, uint32_t(Cfg::kBlockN)};
  p.own_k_map = make_tensor_map<3>(own.k.data_ptr(), CU_TENSOR_MAP_DATA_TYPE_FLOAT16, sizes, strides, box);
  p.own_v_map = make_tensor_map<3>(own.v.data_ptr(), CU_TENSOR_MAP_DATA_TYPE_FLOAT16, sizes, strides, box);
  p.own_ok = own.ok.data_ptr<int>();
  int* pre_base = room > 0 ? own.pre_base.data_ptr<int>() : nullptr;  // (the pass writes it only then)
  p.pre_base = pre_base;
  // (A sequence whose queries fit one item converts each tile once anyway.)
  const int min_queries = Cfg::kBlockM / p.item_group;
  const int64_t threads = rows * a.kv.num_kv_heads * (hd / 8);
  // One wave at most (the loops stride over the rows): as many blocks as the
  // SMs hold at once (six, not eight, at 40 registers a thread).
  const auto kernel = sm90::prefill_own_kv<typename Cfg::CacheT, Cfg::kVectorScales>;
  static const int resident = [&] {
    int n = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, sm90::kOwnKvThreads, 0));
    return std::max(n, 1);
  }();
  const int64_t blocks = std::min<int64_t>(ceil_div<int64_t>(threads, sm90::kOwnKvThreads), int64_t(resident) * sms);
  // A test hook: NaN in the tokens' rows (1), the prefix rows (2) or both,
  // so that a test sees which outputs read them (the bits are otherwise the
  // converters').
  const int nan_rows = static_cast<int>(env_int("TILEINFER_PREFILL_NAN_ROWS", 0, 3, 0));
  C10_CUDA_CHECK(launch_kernel(kernel, dim3(unsigned(blocks)), dim3(sm90::kOwnKvThreads), 0, stream, a.programmatic, a,
                               p.scale_top, static_cast<__half*>(own.k.data_ptr()),
                               static_cast<__half*>(own.v.data_ptr()), own.ok.data_ptr<int>(),
                               pre_base, static_cast<int>(room), min_queries, nan_rows));
  return own;
}

// Tensor maps and a persistent grid (at most one block per SM) for the
// warp-specialized kernel. The maps depend on pointers and shapes only.
// `decodes`: a mixed step's decode launches, enqueued by the call, beside
// the kernel (above) or before it.
template <class Cfg>
void launch_warp_specialized(const char* op, const AttentionParams& a, const at::Tensor& q, cudaStream_t stream,
                             const std::function<void()>* decodes = nullptr) {
  using QT = typename Cfg::QT;
  constexpr int D = Cfg::D;
  const CUtensorMapDataType type =
      std::is_same_v<QT, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  sm90::PrefillParams p{};
  p.a = a;
  const int item_group = prefill_item_group(a.group_size, Cfg::kBlockM);
  p.item_group = item_group;
  p.item_heads = a.num_q_heads / item_group;
  // The copy engine takes strides that step past whole rows: a view whose
  // heads or tokens overlap (or repeat, stride 0) goes through a copy.
  // The maps span the head dim; a tile dim D above it (tile_table.h) reads
  // its last box partly outside them, and the copy engine fills zeros there.
  const int64_t hd = a.kv.head_dim;
  const bool rows_apart = q.stride(1) >= hd && q.stride(0) >= q.size(1) * q.stride(1);
  const at::Tensor qm = rows_apart ? q : q.contiguous();
  p.q_map = make_tensor_map<3>(qm.data_ptr(), type, {uint64_t(hd), uint64_t(a.num_q_heads), uint64_t(a.num_tokens)},
                               {uint64_t(qm.stride(1)) * 2, uint64_t(qm.stride(0)) * 2},
                               {64u, uint32_t(item_group), uint32_t(Cfg::kBlockM / item_group)});
  const int page = a.kv.page_size;
  p.box_rows = page < Cfg::kBlockN ? page : Cfg::kBlockN;
  const uint64_t sizes[4] = {uint64_t(hd), uint64_t(page), uint64_t(a.kv.num_kv_heads), uint64_t(a.kv.num_pages)};
  const uint64_t row = uint64_t(hd) * (Cfg::kQuant ? 1 : 2);
  const uint64_t strides[3] = {row, row * page, row * page * a.kv.num_kv_heads};
  if constexpr (Cfg::kQuant) {
    // Pages as stored, whole rows per box, into the converters' raw ring.
    const uint32_t box[4] = {uint32_t(D), uint32_t(p.box_rows), 1u, 1u};
    const auto bytes = CU_TENSOR_MAP_DATA_TYPE_UINT8;
    p.k_map = make_tensor_map<4>(a.kv.k_cache, bytes, sizes, strides, box, CU_TENSOR_MAP_SWIZZLE_NONE);
    p.v_map = make_tensor_map<4>(a.kv.v_cache, bytes, sizes, strides, box, CU_TENSOR_MAP_SWIZZLE_NONE);
  } else {
    const uint32_t box[4] = {64u, uint32_t(p.box_rows), 1u, 1u};
    p.k_map = make_tensor_map<4>(a.kv.k_cache, type, sizes, strides, box);
    p.v_map = make_tensor_map<4>(a.kv.v_cache, type, sizes, strides, box);
  }
  p.num_row_tiles = static_cast<int>(ceil_div<int64_t>(int64_t(item_group) * a.max_q_len, Cfg::kBlockM));
  // The scheduler's order and tail (sm90/prefill_order.h). A batch whose
  // keys and values (estimated from max_q_len: a prompt's; a chunk after a
  // cached prefix holds more) fit in half the L2 is all tail, heaviest first:
  // there the doubles gain nothing from L2 and their coarser end cost 3-6%
  // (1 x 3456, 3 x 1152, 5 x 700 tokens).
  const int device = c10::cuda::current_device();
  const int sms = cached_device_attribute<cudaDevAttrMultiProcessorCount>(device);
  const int64_t kv_bytes =
      int64_t(2) * a.kv.num_seqs * a.kv.num_kv_heads * a.max_q_len * a.kv.head_dim * (Cfg::kQuant ? 1 : 2);
  const bool fits_l2 = kv_bytes <= cached_device_attribute<cudaDevAttrL2CacheSize>(device) / 2;
  const sm90::PrefillPlan plan = sm90::plan_prefill_order(a.kv.num_seqs, p.item_heads, p.num_row_tiles,
                                                          a.mixed_queries > 0, fits_l2, sms);
  p.order = plan.order;
  p.tail_pairs = plan.tail_pairs;
  // Items are numbered 2 * unit + half, and a warp looks at 32 at a time: up
  // to 63 rounds of 2 * G item numbers past the last unit
  // (sm90/prefill_scheduler.cuh), all in int32.
  TILEINFER_CHECK(2 * plan.units + 128 * int64_t(sms) < (int64_t(1) << 31), op,
                  ": too many work items (row tiles x sequences x heads)");
  const dim3 grid(static_cast<unsigned>(plan.grid));

  p.a.programmatic = programmatic_launch(c10::cuda::current_device());
  // A quantized cache: per-vector scales' powers of two and the step's own
  // keys and values in fp16, held until the kernel is enqueued (this
  // stream's allocations).
  at::Tensor scale_top;
  OwnKv own;
  if constexpr (Cfg::kVectorScales) scale_top = launch_scale_range(p, q, stream);
  if constexpr (Cfg::kQuant) {
    if (own_kv_pass()) own = launch_own_kv<Cfg>(p, q, sms, stream);
  }
  const int beside = decodes != nullptr ? decode_sms(sms, a.kv.num_seqs) : 0;
  const bool split = beside > 0 && plan.grid >= 2 * beside;
  if (decodes != nullptr && (split || decodes_on_side_stream())) {
    at::Tensor counter;
    if (split) {
      counter = at::zeros({2}, q.options().dtype(at::kInt));
      p.item_counter = counter.data_ptr<int>();
    }
    const c10::cuda::CUDAStream side = side_stream(stream, device);
    StreamFork fork(stream, side.stream());
    int least = 0, greatest = 0;
    C10_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    const int first = plan.grid - beside;  // (split only)
    if (split) C10_CUDA_CHECK((launch_prefill_kernel<Cfg, true>(greatest, dim3(first), stream, p)));
    else C10_CUDA_CHECK((launch_prefill_kernel<Cfg, false>(greatest, grid, stream, p)));
    {
      const c10::cuda::CUDAStreamGuard on_side(side);
      if (split && gate_decodes())
        C10_CUDA_CHECK(launch_kernel(sm90::hand_out_gate, dim3(1), dim3(1), 0, side.stream(), false,
                                     p.item_counter + 1, first));
      (*decodes)();
      if (split) C10_CUDA_CHECK((launch_prefill_kernel<Cfg, true>(0, dim3(beside), side.stream(), p)));
    }
    fork.join();
    return;
  }
  if (decodes != nullptr) (*decodes)();
  C10_CUDA_CHECK((launch_prefill_kernel<Cfg, false>(0, grid, stream, p)));
}

// The warp-specialized kernel over a quantized cache: int8 (per-vector
// scales), fp8 with per-tensor or per-vector scales.
template <typename T, int D>
void launch_hopper_quant(const char* op, const AttentionParams& p, const PagedShape& s, const at::Tensor& q,
                         cudaStream_t stream, const std::function<void()>* decodes) {
  TILEINFER_DISPATCH_QUANT(s.cache_dtype, op, [&] {
    if constexpr (std::is_same_v<cache_t, __nv_fp8_e4m3>) {
      if (s.scale_per_tensor)
        return launch_warp_specialized<sm90::PrefillTile<T, D, cache_t>>(op, p, q, stream, decodes);
    }
    launch_warp_specialized<sm90::PrefillTile<T, D, cache_t, true>>(op, p, q, stream, decodes);
  });
}

// prefill_as, or (mixed_queries > 0) its part of a mixed step: the sequences
// of more than mixed_queries queries (attention_work.cuh, "Mixed steps").
void run_prefill(const char* op, at::Tensor& out, const std::optional<at::Tensor>& lse, const at::Tensor& q,
                 const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& block_tables,
                 const at::Tensor& seq_lens, const at::Tensor& cu_seqlens_q, int64_t max_q_len, double scale,
                 bool causal, const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                 const std::optional<at::Tensor>& k_smooth, int64_t window_left, double logits_soft_cap,
                 const std::optional<at::Tensor>& sinks, int64_t mixed_queries, bool batch_invariant,
                 const std::function<void()>* decodes = nullptr) {
  const PagedShape s = check_paged_attention(op, q, k_cache, v_cache, block_tables, seq_lens,
                                             cu_seqlens_q, max_q_len, k_scale, v_scale, k_smooth);
  check_variants(op, window_left, logits_soft_cap, sinks, q.size(1), q.device());
  check_token_tensor(op, "out", out, q.size(0), q.size(1), s.head_dim, q.scalar_type(), q.device());
  if (lse.has_value()) check_lse(op, "lse", *lse, q.size(0), q.size(1), q.device());
  const c10::cuda::CUDAGuard guard(q.device());
  AttentionParams p = make_attention_params(op, s, q, k_cache, v_cache, block_tables, seq_lens,
                                            cu_seqlens_q, max_q_len, scale, causal, k_scale, v_scale,
                                            k_smooth, window_left, logits_soft_cap, sinks);
  // A mixed step's decodes (they write out's other rows): beside the
  // warp-specialized kernel or on a side stream after it
  // (launch_warp_specialized), when out is written in place; otherwise
  // before the prefill.
  const bool hopper = use_hopper_prefill(s, q.scalar_type(), q.get_device(), p);
  const bool launcher_decodes = decodes != nullptr && hopper && rows_aligned16(out) && rows_aligned16(q) &&
                                q.size(0) > 0 && q.size(1) > 0 && s.num_seqs > 0 && max_q_len > 0;
  if (decodes != nullptr && !launcher_decodes) (*decodes)();
  if (q.size(0) == 0 || q.size(1) == 0 || s.num_seqs == 0 || max_q_len == 0) return;
  p.mixed_queries = static_cast<int>(mixed_queries);

  // Misaligned views (odd offsets or strides) go through aligned copies; rows
  // of no sequence keep their contents through the copy back.
  const at::Tensor q_c = aligned_rows(q);
  at::Tensor target = aligned_rows(out);
  p.q = q_c.data_ptr();
  p.q_stride_token = q_c.stride(0);
  p.q_stride_head = q_c.stride(1);
  p.out = target.data_ptr();
  p.o_stride_token = target.stride(0);
  p.o_stride_head = target.stride(1);
  p.lse = lse.has_value() ? lse->data_ptr<float>() : nullptr;

  // Rows of a sequence (group x queries, plus a tile's worth) are int32 in the kernels.
  TILEINFER_CHECK(p.group_size * max_q_len < (int64_t(1) << 31) - 1024, op,
                  ": group size * max_q_len must fit in int32");
  // On max_q_len, not on the packed rows (group x max_q_len): the crossover
  // below was measured in blocks, and packing keeps the block count. The two
  // tiles give a row different bits, and max_q_len is the batch's: a
  // batch-invariant step keeps the small tile. (The Hopper kernel's items
  // hold all of their rows' keys; it keeps 128-row items for a
  // batch-invariant step: prefill_three_consumers.)
  const bool large = !batch_invariant && use_large_prefill_tile(max_q_len, s.head_dim);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (hopper) {
    TILEINFER_DISPATCH_HALF(q.scalar_type(), op, [&] {
      TILEINFER_DISPATCH_TILE_DIM(s.head_dim, op, [&] {
        const std::function<void()>* side = launcher_decodes ? decodes : nullptr;
        if (s.quantized) {
          if constexpr (TILE_DIM <= 128)  // (use_hopper_prefill)
            launch_hopper_quant<scalar_t, TILE_DIM>(op, p, s, q_c, stream, side);
        } else {
          if constexpr (TILE_DIM == 64) {
            if (prefill_three_consumers(p, batch_invariant, sm_count(q.device())))
              return launch_warp_specialized<sm90::PrefillTile<scalar_t, 64, scalar_t, false, 3>>(op, p, q_c,
                                                                                                stream, side);
          }
          launch_warp_specialized<sm90::PrefillTile<scalar_t, TILE_DIM>>(op, p, q_c, stream, side);
        }
      });
    });
    if (!target.is_same(out)) out.copy_(target);
    return;
  }
  TILEINFER_DISPATCH_FLOAT(q.scalar_type(), op, [&] {
    TILEINFER_DISPATCH_TILE_DIM(s.head_dim, op, [&] {
      if constexpr (std::is_same_v<scalar_t, float>) {
        launch_fp32<TILE_DIM, PrefillWork>(op, p, stream);
      } else if (s.quantized) {
        launch_prefill_quant<scalar_t, TILE_DIM>(op, p, s, large, stream);
      } else {
        if constexpr (TILE_DIM <= 128) {
          if (large) return launch_tile<PrefillTileLarge<scalar_t, TILE_DIM>, PrefillWork>(op, p, stream);
        }
        launch_tile<PrefillTileSmall<scalar_t, TILE_DIM>, PrefillWork>(op, p, stream);
      }
    });
  });
  if (!target.is_same(out)) out.copy_(target);
}

}  // namespace

void prefill_as(const char* op, at::Tensor& out, const std::optional<at::Tensor>& lse, const at::Tensor& q,
                const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& block_tables,
                const at::Tensor& seq_lens, const at::Tensor& cu_seqlens_q, int64_t max_q_len, double scale,
                bool causal, const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                const std::optional<at::Tensor>& k_smooth, int64_t window_left, double logits_soft_cap,
                const std::optional<at::Tensor>& sinks) {
  run_prefill(op, out, lse, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len, scale, causal,
              k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks, 0, false);
}

void prefill_long_sequences(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                            const at::Tensor& cu_seqlens_q, int64_t max_q_len, double scale, bool causal,
                            const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                            const std::optional<at::Tensor>& k_smooth, int64_t window_left,
                            double logits_soft_cap, const std::optional<at::Tensor>& sinks,
                            bool batch_invariant, const std::function<void()>& decodes) {
  run_prefill("attention", out, std::nullopt, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len,
              scale, causal, k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks, kMaxDecodeQueries,
              batch_invariant, &decodes);
}

void prefill(at::Tensor& out, const std::optional<at::Tensor>& lse, const at::Tensor& q,
             const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& block_tables,
             const at::Tensor& seq_lens, const at::Tensor& cu_seqlens_q, int64_t max_q_len, double scale,
             bool causal, const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
             const std::optional<at::Tensor>& k_smooth, int64_t window_left, double logits_soft_cap,
             const std::optional<at::Tensor>& sinks, const std::optional<at::Tensor>& tree_mask) {
  check_no_tree_mask("prefill", tree_mask);
  prefill_as("prefill", out, lse, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len, scale,
             causal, k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks);
}

}  // namespace tileinfer::cuda

TORCH_LIBRARY_IMPL(tileinfer_attn, CUDA, m) { m.impl("prefill", &tileinfer::cuda::prefill); }
