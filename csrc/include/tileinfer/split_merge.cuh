// The merge of a batch-invariant decode plan's split partials, split by split
// in split order, written once for the two kernels that perform it: combine,
// from the partials in memory (combine.cuh, kLseGated), and a decode block
// that walks every split of its rows and merges them itself, without writing
// partials (tile_epilogue.cuh, merge_split_rows). The same inputs in the same
// order through the same operations give the same bits, so a sequence's
// output does not depend on which of the two ran it, that is on the batch
// (decode.cu picks the block merge when each (sequence, KV head) has one
// block).
//
// A partial is (o, lse): o normalized by its own softmax sum, lse natural-log
// (combine.cuh). The running state after splits 0..j holds the largest lse so
// far (max), den = sum_i exp(lse_i - max) and acc = sum_i exp(lse_i - max) o_i;
// split j + 1 takes it to
//   max' = max(max, lse), r = exp(max - max'), w = exp(lse - max'),
//   den' = den r + w, acc' = acc r + w o,
// and the row is acc / den, its lse max + log(den). Each rounding is written
// out (__fmul_rn, __fmaf_rn, ...): the compiler contracts a multiply and an
// add of plain operators where it sees fit, which may differ between two
// kernels. The maximum's zero is made +0: combine finds the maxima of a chunk
// of splits with a prefix scan in another order than the block's split by
// split, and fmaxf of a -0 and a +0 may keep either.
//
// A split whose lse is -inf (no key visible to the row, or no key at all) is
// skipped. A NaN lse (a non-finite query row) is merged: den and acc become
// NaN, and the row comes out as 0 with lse -inf, as combine has always made of
// an all-NaN row (tests/test_int8_gpu.py).
#pragma once

#include <cmath>

#include "common.cuh"

namespace tileinfer {

__device__ __forceinline__ bool merges_split(float lse) { return lse != -INFINITY; }

// The running maximum after a split of lse `lse` (canonical zero; NaN ignored).
__device__ __forceinline__ float merged_max(float max, float lse) { return __fadd_rn(fmaxf(max, lse), 0.f); }

// Split j + 1's factors: acc' = acc r + w o, den' = den r + w.
struct MergeStep {
  float max;  // max'
  float r;    // the state's factor
  float w;    // the split's weight
};
__device__ __forceinline__ MergeStep merge_step(float max, float lse) {
  MergeStep s;
  s.max = merged_max(max, lse);
  const float base = s.max == -INFINITY ? 0.f : s.max;  // (a NaN lse with nothing before it)
  s.r = exp2f(__fmul_rn(max - base, kLog2e));  // max = -inf: 0
  s.w = exp2f(__fmul_rn(lse - base, kLog2e));
  return s;
}
__device__ __forceinline__ float merge_acc(float acc, float o, const MergeStep& s) {
  return __fmaf_rn(s.w, o, __fmul_rn(acc, s.r));
}
__device__ __forceinline__ float merge_den(float den, const MergeStep& s) { return __fmaf_rn(den, s.r, s.w); }

// The merged row: acc times merged_inv(den), 0 where no split was merged (or
// den is NaN); its lse.
__device__ __forceinline__ float merged_inv(float den) { return den > 0.f ? __fdiv_rn(1.f, den) : 0.f; }
__device__ __forceinline__ float merged_out(float acc, float den, float inv) {
  return den > 0.f ? __fmul_rn(acc, inv) : 0.f;
}
__device__ __forceinline__ float merged_lse(float max, float den) {
  return den > 0.f ? __fadd_rn(max, logf(den)) : -INFINITY;
}

}  // namespace tileinfer
