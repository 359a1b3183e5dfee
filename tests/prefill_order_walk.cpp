// Walks every block of the Hopper prefill kernel's persistent schedule
// (csrc/include/tileinfer/sm90/prefill_order.h) on the CPU, taking items as
// the scheduler's next_item does (a row tile with rows of the sequence's
// queries), for tests/test_prefill_order.py.
//
// stdin, one batch per line:
//   sms heads group block_m max_q_len mixed fits_l2 num_seqs q_0 ... q_{n-1}
// heads: the items' heads per sequence, group: the query heads of an item.
// mixed: 0 for a prefill step, else the most queries a sequence that the
// decode path takes has (AttentionParams::mixed_queries: prefill_takes skips
// those sequences).
// stdout, per batch: "plan <order> <tail_pairs> <units> <grid>", then one
// "<block> <item> <seq> <head> <row_tile>" line per item taken, then "end".
#include <cstdio>
#include <vector>

#include "tileinfer/sm90/prefill_order.h"

using tileinfer::sm90::PrefillPlan;
using tileinfer::sm90::PrefillWalk;

int main() {
  long long sms, heads, group, block_m, max_q_len, mixed, fits_l2, n;
  while (std::scanf("%lld %lld %lld %lld %lld %lld %lld %lld", &sms, &heads, &group, &block_m, &max_q_len, &mixed,
                    &fits_l2, &n) == 8) {
    std::vector<long long> q(n);
    for (auto& x : q) {
      if (std::scanf("%lld", &x) != 1) {
        std::fprintf(stderr, "prefill_order_walk: a batch line ends before its %lld query counts\n", n);
        return 1;
      }
    }
    const long long row_tiles = (group * max_q_len + block_m - 1) / block_m;
    const PrefillPlan plan = tileinfer::sm90::plan_prefill_order(n, heads, row_tiles, mixed != 0, fits_l2 != 0, sms);
    std::printf("plan %d %d %lld %d\n", static_cast<int>(plan.order), plan.tail_pairs,
                static_cast<long long>(plan.units), plan.grid);
    for (int b = 0; b < plan.grid; ++b) {
      const PrefillWalk walk(plan.order, static_cast<int>(n), static_cast<int>(heads), static_cast<int>(row_tiles),
                             plan.tail_pairs, plan.grid, b);
      for (int i = 0;; ++i) {
        const int item = walk.item_at(i);
        if (!walk.in_range(item)) break;
        PrefillWalk::Slot s = walk.at(item);
        const long long rows = q[s.seq] * group;
        const int own_row_tiles = static_cast<int>((rows + block_m - 1) / block_m);
        if (walk.is_double(item)) s.row_tile = walk.double_row_tile(own_row_tiles, item);
        const bool decode_takes = mixed > 0 && q[s.seq] <= mixed;  // (attention_work.cuh, prefill_takes)
        if (s.row_tile >= 0 && s.row_tile * block_m < rows && !decode_takes)
          std::printf("%d %d %d %d %d\n", b, item, s.seq, s.head, s.row_tile);
      }
    }
    std::printf("end\n");
  }
  return 0;
}
