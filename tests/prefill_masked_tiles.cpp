// Prints MaskedTiles (csrc/include/tileinfer/sm90/prefill_masked_tiles.h) for
// tests/test_prefill_mask.py.
//
// stdin, one item per line:  block_n key_begin key_end causal qmin lo_last
// stdout, one line each:     from until
#include <cstdio>

#include "tileinfer/sm90/prefill_masked_tiles.h"

using tileinfer::sm90::MaskedTiles;

int main() {
  int bn, key_begin, key_end, causal, qmin, lo_last;
  while (std::scanf("%d %d %d %d %d %d", &bn, &key_begin, &key_end, &causal, &qmin, &lo_last) == 6) {
    const MaskedTiles m = bn == 64 ? MaskedTiles::make<64>(key_begin, key_end, causal != 0, qmin, lo_last)
                                   : MaskedTiles::make<128>(key_begin, key_end, causal != 0, qmin, lo_last);
    std::printf("%d %d\n", m.from, m.until);
  }
  return 0;
}
