// Walks every block of a batch-invariant decode pair's runs of splits
// (csrc/include/tileinfer/decode_splits.h, split_run) on the CPU, for
// tests/test_splits.py: for every count of splits with keys (live), of
// split slots and of blocks a pair, each split with keys must be in exactly
// one block's run, the runs consecutive splits, and each empty split (live
// .. slots - 1) written by exactly one block. Prints "ok", or the first case
// that breaks a rule and exits 1.
#include <cstdio>
#include <vector>

#include "tileinfer/decode_splits.h"

int main() {
  for (int slots = 1; slots <= 32; ++slots) {
    for (int live = 1; live <= slots; ++live) {
      for (int blocks = 1; blocks <= 160; ++blocks) {
        std::vector<int> walked(slots, 0), written(slots, 0);
        for (int b = 0; b < blocks; ++b) {
          const tileinfer::SplitRun run = tileinfer::split_run(live, blocks, b);
          if (run.count < 0 || (run.count > 0 && (run.first < 0 || run.first + run.count > live))) {
            std::printf("live %d slots %d blocks %d: block %d has run [%d, +%d)\n", live, slots, blocks, b, run.first,
                        run.count);
            return 1;
          }
          for (int s = run.first; s < run.first + run.count; ++s) ++walked[s];
          if (run.empty < live) {
            std::printf("live %d slots %d blocks %d: block %d writes split %d, which holds keys\n", live, slots,
                        blocks, b, run.empty);
            return 1;
          }
          for (int s = run.empty; s < slots; s += blocks) ++written[s];
        }
        for (int s = 0; s < slots; ++s) {
          const int times = s < live ? walked[s] : written[s];
          if (times != 1 || (s < live && written[s] != 0) || (s >= live && walked[s] != 0)) {
            std::printf("live %d slots %d blocks %d: split %d walked %d times, its lse written %d times\n", live,
                        slots, blocks, s, walked[s], written[s]);
            return 1;
          }
        }
      }
    }
  }
  std::printf("ok\n");
  return 0;
}
