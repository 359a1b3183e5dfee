// Consumers of the Hopper prefill kernel: Cfg::kConsumers warpgroups (two,
// or three at d 64) of 64 query rows each, over the same ring of key tiles.
// Per tile:
//   S = Q K^T   wgmma m64n{kBlockN}k16, Q and K from shared memory (K-major)
//   mask, online softmax (softmax.cuh; P rounded to the element type)
//   O += P V    wgmma m64n{D}k16, P from registers (the S accumulator of 16
//               keys is, register for register, the A fragment), V from
//               shared memory N-major
// with one arrival per warp on the stage's empty_k barrier as soon as S has
// completed (the producer's next keys can land while P V still reads the
// values) and on empty_v after P V.
//
// Overlaps that keep the tensor cores busy:
//   - ping-pong: warpgroup w issues the S of each tile (together with the
//     P V of the tile before) only in its turn (named barrier
//     kTurnBarrier + w) and hands the turn to the next right after, so the
//     tensor cores run one warpgroup's products while the others do their
//     softmax. An item's last P V, issued after its softmax, does not wait
//     for a turn. Every warpgroup walks every tile of every item (one whose rows
//     see none of a tile skips the math, not the turn): turns and ring stay
//     in step.
//   - intra-warpgroup: S of tile i is issued together with P V of tile
//     i - 1, and the mask and softmax of tile i run while that P V does.
//     ptxas moves the wait for that P V, which shares no register with the
//     softmax, above the softmax unless a memory operation that needs the
//     softmax stands before the wait: every kernel has a store of the row
//     sums that never runs (`pin`). ptxas keeps the products'
//     order only if the steady-state loop has no branch on which products
//     are in flight, so the first tile, the steady state and the last P V
//     are separate pieces of code.
//
// A quantized cache (Cfg::kQuant): the operands are fp16 (prefill_convert.cuh);
// each warpgroup first converts its query rows, in place. A row's factor
// (k_scale over the row's power of two) joins the softmax's exp2
// multiplier, and P comes out of the exp2 already times the tile table's
// kHeadroom (a bias on its argument; the row sums carry the same factor,
// and the output takes v_scale). Per-vector scales are already on the keys
// and values, over a power of two per sequence and KV head
// (prefill_scale_range.cuh), which takes k_scale's and v_scale's place.
// (With a soft-cap the tanh takes the true product: the scores are
// multiplied by the row factor first.)
//
// Soft-capped scores over a bf16 cache (CapForm::kFixedOffset, a kernel of
// its own: prefill_kernel.cuh) take their exponents against a fixed offset
// (softmax.cuh, fixed_offset) instead of the running maximum: no row
// maximum per tile, and O is never rescaled. A quantized cache's steps
// without a soft-cap run a kernel without the tanh (CapForm::kNone): in
// the loop, the branch that multiplies a capped row by its factor had
// ptxas copy 21 of a thread's 64 scores between registers on every tile,
// capped or not, and spill in the masked tiles.
//
// Thread layout (as the mma.m16n8k16 accumulator, repeated over N / 8): lane
// 4 g + c of warp v holds rows 16 v + g and 16 v + g + 8 of its warpgroup; the
// accumulator element d[4 j + 2 R + e] is row R, column 8 j + 2 c + e.
#pragma once

#include <climits>

#include "../attention_work.cuh"
#include "../softmax.cuh"
#include "prefill_convert.cuh"
#include "prefill_epilogue.cuh"
#include "prefill_mask.cuh"
#include "prefill_smem.cuh"
#include "wgmma.cuh"

namespace tileinfer {
namespace sm90 {

// What a kernel's consumers do with a soft-cap.
enum class CapForm {
  kAny,          // what the step's ScoreMap says, at run time
  kFixedOffset,  // capped, exponents against a fixed offset (bf16 products: Cfg::kFixedOffsetFits)
  kNone,         // never capped (quantized caches; their capped steps take kAny)
};

constexpr int kTurnBarrier = 2;   // named barriers 2-4: "consumer w may issue"
constexpr int kQueryBarrier = 5;  // named barriers 5-7: consumer w's queries are converted (quantized)

template <class Cfg, CapForm kCap = CapForm::kAny>
__device__ __forceinline__ void prefill_consume(const PrefillParams& p, const PrefillSmem<Cfg>& sm, int wg) {
  using T = typename Cfg::T;
  constexpr bool kFixedOffset = kCap == CapForm::kFixedOffset;
  static_assert(kCap != CapForm::kNone || Cfg::kQuant, "the bf16 / fp16 loop decides a cap at run time");
  constexpr int D = Cfg::D;
  constexpr int BM = Cfg::kBlockM;
  constexpr int BN = Cfg::kBlockN;
  const int tid = threadIdx.x - 128 * (wg + 1);
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int quad = lane & 3;
  const int r0 = 64 * wg + 16 * warp + (lane >> 2);  // this thread's rows of the item: r0, r0 + 8
  const int box_shift = __ffs(p.box_rows) - 1;
  // Scale (or soft-cap) folded into the exp2 argument when it can be (softmax.cuh).
  const ScoreMap smap = ScoreMap::make(p.a.scale, p.a.soft_cap, kFastTanhMaxCap<typename Cfg::QT>);
  const float offset = kFixedOffset ? fixed_offset(p.a.soft_cap) : 0.f;
  const uint32_t q_base0 = smem_u32(sm.q(0)) + 64 * wg * 128;  // this warpgroup's rows of block 0, buffer 0

  // The turn goes round the consumers in order: w issues, then hands it to
  // `next`. Each turn barrier counts w's threads and those of the consumer
  // before it (256).
  // (Two consumers: wg ^ 1, the form that keeps their SASS as it was.)
  const int next = Cfg::kConsumers == 2 ? wg ^ 1 : wg + 1 == Cfg::kConsumers ? 0 : wg + 1;
  if (wg == Cfg::kConsumers - 1) named_arrive(kTurnBarrier, 256);  // consumer 0 issues first
  const bool pin = p.item_group < 0;  // false: prefill.cu sets it positive (the key loop's `pin` store)

  uint32_t tiles = 0;
  for (uint32_t items = 0;; ++items) {
    // The item comes with its query tile, from the producer (prefill_smem.cuh).
    // Lane 0 reads it and hands it to its warp, so that the read is ordered
    // before its own arrival on q_empty (after which the producer may write the buffer again).
    const RingSlot<Cfg::kQBuffers> qs(items);
    mbar_wait(&sm.q_full[qs.stage], qs.parity);
    const WorkItem w = warp_broadcast(lane == 0 ? sm.item[qs.stage] : WorkItem{});
    if (!w.active) break;
    uint8_t* const q_tile = sm.q(qs.stage);
    // An offset from buffer 0's address, not smem_u32(q_tile): with the
    // address taken anew per item, ptxas built the Q descriptors inside the
    // turn at the tensor cores (25 more instructions there, and slower).
    const uint32_t q_base = q_base0 + qs.stage * Cfg::kQBytes;

    // Quantized: the rows' score factors, and NaN output for a row that held
    // a non-finite value (as the float reference gives). Uncapped, a row's
    // factor joins the softmax's multiplier (per row: OnlineSoftmax::update),
    // a multiply per score less; a factor of 0, from a zero scale, becomes a
    // tiny one (0 times a masked score, -inf, would be NaN). Capped, the tanh
    // takes the true product: the scores are multiplied by the factor first.
    float unscale[2] = {1.f, 1.f};
    bool bad[2] = {false, false};
    if constexpr (Cfg::kQuant) {
      convert_queries<Cfg>(p, q_tile, w, r0, quad, smap.pre_factor(), unscale, bad);
      wgmma::fence_proxy_async_smem();  // the converted rows, visible to the tensor cores ...
      named_sync(kQueryBarrier + wg, 128);  // ... once the whole warpgroup's are written
      if (!smap.cap) {
#pragma unroll
        for (int R = 0; R < 2; ++R) unscale[R] = smap.k * unscale[R] == 0.f ? 1e-30f : smap.k * unscale[R];
      }
    }

    int qpos[2];
#pragma unroll
    for (int R = 0; R < 2; ++R) qpos[R] = row_query<true>(w, r0 + 8 * R).qpos;
    // The warpgroup's query positions (rows are ordered by query; padding
    // rows last): its skips are warpgroup-uniform, as wgmma needs.
    const int wg_rows = min(w.q_count * w.group - w.row_base - 64 * wg, 64);
    const bool wg_has_rows = wg_rows > 0;
    const int wg_qmin = wg_has_rows ? row_query<true>(w, 64 * wg).qpos : INT_MAX;
    const int wg_qmax = wg_has_rows ? row_query<true>(w, 64 * wg + wg_rows - 1).qpos : INT_MIN;

    // A sink joins its row in the epilogue, after the keys
    // (SoftmaxRow::join_sink): P stays relative to the keys' maximum, where a
    // row started from a sink far above its keys would round their fp16
    // probabilities (fp16 queries, a quantized cache) into fp16's
    // subnormals; and a row with a fixed offset keeps it.
    OnlineSoftmax<2, 4> smx;
    float sink[2];
#pragma unroll
    for (int R = 0; R < 2; ++R) {
      sink[R] = PrefillWork::sink(p.a, w, row_query<true>(w, r0 + 8 * R).head);
      if constexpr (kFixedOffset) {
        smx.row[R].init_fixed(offset);
      } else {
        smx.row[R].init();
      }
    }
    float o[D / 2];
#pragma unroll
    for (int x = 0; x < D / 2; ++x) o[x] = 0.f;

    // Tiles this warpgroup computes: [my_first, my_tiles) of the item's
    // tiles (causal: up to its last query's position; window: from its first
    // query's first visible key). The others are only waited for and
    // released, so that the ring moves on.
    const int num_tiles = w.key_end > w.key_begin ? ceil_div(w.key_end - w.key_begin, BN) : 0;
    int my_first = 0;
    int my_tiles = 0;
    if (wg_has_rows) {
      my_tiles = num_tiles;
      if (p.a.causal) my_tiles = min(num_tiles, max(0, ceil_div(wg_qmax + 1 - w.key_begin, BN)));
      my_first = min(my_tiles, max(0, (window_first_key(wg_qmin, p.a.window_left) - w.key_begin) / BN));
    }

    const MaskedTiles masked = MaskedTiles::make<BN>(w.key_begin, w.key_end, p.a.causal, wg_qmin,
                                                     window_first_key(qpos[1], p.a.window_left));

    float acc[BN / 2];       // S of the tile in flight
    float s[2][BN / 4];      // s[R][2 j + e]: row R, key 8 j + 2 quad + e; then the probabilities
    uint32_t a[BN / 16][4];  // P rounded to T: the A operand of its P V product
    float factor[2];
    // One arrival per warp on `bar`, once the whole warp is done.
    auto release = [&](uint64_t* bar) {
      __syncwarp();
      if (lane == 0) mbar_arrive(bar);
    };
    // Masked online softmax of the S just completed (`outside`: its stage's
    // mask, from take_s): s holds its probabilities, factor what O must
    // be multiplied by.
    auto softmax = [&](int i, uint32_t outside) {
      wgmma::fence_regs(acc);
      wgmma::acc_to_rows<BN>(acc, s);
      if constexpr (Cfg::kQuant) {
        if constexpr (kCap != CapForm::kNone) {
          if (smap.cap) {
#pragma unroll
            for (int R = 0; R < 2; ++R)
#pragma unroll
              for (int c = 0; c < BN / 4; ++c) s[R][c] *= unscale[R];
          }
          smap.template apply_premultiplied<true>(s);
        }
      } else if constexpr (kFixedOffset) {
        smap.template apply_cap<true>(s);
      } else {
        smap.template apply<true>(s);  // the one-instruction tanh where accurate enough (softmax.cuh)
      }
      if (masked(i, outside)) {
        const TileMask mask{w.key_begin + i * BN, w.key_end, outside, box_shift, p.a.window_left, p.a.causal};
        mask.template apply<BN>(s, qpos, quad);
      }
      if constexpr (Cfg::kQuant) {
        const bool cap = kCap != CapForm::kNone && smap.cap;
        const float row_k[2] = {cap ? smap.k : unscale[0], cap ? smap.k : unscale[1]};
        smx.template update<Cfg::kSoftmaxSlack>(s, row_k, factor, Cfg::kProbBias);  // P times kHeadroom
      } else if constexpr (kFixedOffset) {
        smx.update_fixed(s, smap.k);
      } else {
        smx.template update<Cfg::kSoftmaxSlack>(s, smap.k, factor);
      }
    };
    auto pack_p = [&]() { wgmma::rows_to_a<T, BN>(s, a); };
    // O was accumulated against the previous maximum: rescale it before the next P joins.
    auto rescale_o = [&]() { wgmma::rescale_rows<D>(o, factor); };
    // Waits for the key tile of `slot`, then issues its S = Q K^T in this
    // warpgroup's turn. Returns the stage's mask, read before the turn:
    // read once S had completed, the load waited behind the tile's scale
    // loads and stood between S and the softmax (7% of the consumers' time
    // at 1 x 2k over an int8 cache, Nsight Compute's stall samples). Lane 0
    // reads it and hands it to its warp: the read is then ordered before
    // the warp's release of the key tile by lane 0 itself (release_k).
    auto take_s = [&](const RingSlot<Cfg::kStages>& slot) {
      mbar_wait(&sm.full_k[slot.stage], slot.parity);
      uint32_t outside = 0;
      if (lane == 0) outside = sm.stage_mask[slot.stage];
      outside = __shfl_sync(0xffffffffu, outside, 0);
      named_sync(kTurnBarrier + wg, 256);
      wgmma::issue_qk<T, BM, BN, D>(acc, q_base, smem_u32(sm.k(slot.stage)));
      return outside;
    };
    // Once S of `stage` has completed: the key tile released.
    auto release_k = [&](int stage) { release(&sm.empty_k[stage]); };
    auto wait_v = [&](const RingSlot<Cfg::kStages>& slot) { mbar_wait(&sm.full_v[slot.stage], slot.parity); };
    // A tile this warpgroup's rows see none of: waited for and released in
    // its turn, so that turns and ring stay in step.
    auto pass = [&]() {
      const RingSlot<Cfg::kStages> slot(tiles++);
      mbar_wait(&sm.full_k[slot.stage], slot.parity);
      wait_v(slot);
      named_sync(kTurnBarrier + wg, 256);
      named_arrive(kTurnBarrier + next, 256);
      release(&sm.empty_k[slot.stage]);
      release(&sm.empty_v[slot.stage]);
    };

    int i = 0;
    for (; i < my_first; ++i) pass();  // before the window of every row
    RingSlot<Cfg::kStages> prev(0);  // the tile whose P V is pending
    // The first tile: S, softmax, P.
    if (i < my_tiles) {
      const RingSlot<Cfg::kStages> slot(tiles++);
      const uint32_t outside = take_s(slot);
      named_arrive(kTurnBarrier + next, 256);
      wgmma::wait<0>();
      release_k(slot.stage);
      softmax(i, outside);
      pack_p();
      prev = slot;
      ++i;
    }
    // The other tiles up to my_tiles - 1: S of tile i and P V of tile i - 1 in flight
    // together; the softmax of tile i runs while P V still does.
    for (; i < my_tiles; ++i) {
      const RingSlot<Cfg::kStages> slot(tiles++);
      wait_v(prev);  // before the turn: values land later than keys
      const uint32_t outside = take_s(slot);
      wgmma::issue_pv<T, D, BN>(o, a, smem_u32(sm.v(prev.stage)));
      named_arrive(kTurnBarrier + next, 256);
      wgmma::wait<1>();  // S of tile i
      release_k(slot.stage);
      softmax(i, outside);
      // Keeps the softmax ahead of the wait for the P V in flight (the top
      // of this file): a store that needs the row sums, never run (`pin`
      // is false at run time, which the compiler cannot tell).
      if (pin) *reinterpret_cast<float2*>(sm.q(0)) = make_float2(smx.row[0].l, smx.row[1].l);
#pragma unroll
      for (int R = 0; R < 2; ++R) wgmma::fence_regs(s[R]);
      if constexpr (!kFixedOffset) wgmma::fence_regs(factor);
      wgmma::wait_pv<D, BN>(o, a);  // P V of tile i - 1: its A registers are free again
      release(&sm.empty_v[prev.stage]);
      if constexpr (!kFixedOffset) rescale_o();
      pack_p();
      prev = slot;
    }
    // Every S product has completed: the query tile is free (kStagedStore:
    // once the epilogue has stored the output rows it stages there).
    if (!Cfg::kStagedStore && lane == 0) mbar_arrive(&sm.q_empty[qs.stage]);
    // Quantized: O is in units of v_scale (the row sums carry the headroom as
    // P does); per vector, of the values' power of two. Loaded while the
    // item's last P V runs: loaded in the epilogue, the wait for it was the
    // item's, on the consumers' path.
    float v_scale = 1.f;
    auto load_v_scale = [&] {
      if constexpr (Cfg::kQuant)
        v_scale = Cfg::kVectorScales ? ItemScales::make<typename Cfg::CacheT>(p, w, true).v : __ldg(p.a.kv.v_scale);
    };
    if (my_tiles > my_first) {
      wait_v(prev);
      wgmma::issue_pv<T, D, BN>(o, a, smem_u32(sm.v(prev.stage)));
      load_v_scale();
      wgmma::wait_pv<D, BN>(o, a);
      release(&sm.empty_v[prev.stage]);
    } else {
      load_v_scale();
    }
    for (; i < num_tiles; ++i) pass();  // past this warpgroup's rows

    float out_factor[2] = {1.f, 1.f};
    if constexpr (Cfg::kQuant) {
#pragma unroll
      for (int R = 0; R < 2; ++R) out_factor[R] = bad[R] ? __int_as_float(0x7fc00000) : v_scale;
    }
    prefill_store<Cfg>(p, w, smx, o, r0, quad, out_factor, sink, q_tile, wg, tid);
    if constexpr (Cfg::kStagedStore) {
      wgmma::fence_proxy_async_smem();  // the staging stores, ordered before the producer's next copy into the tile
      release(&sm.q_empty[qs.stage]);
    }
  }
}

}  // namespace sm90
}  // namespace tileinfer
