// CPU prefill, decode (split partials) and combine: plain C++ with fp32
// accumulation, the same semantics and partial-result format as the CUDA
// kernels (docs/DESIGN.md "Partial results", "Splits"), so that a machine
// without a GPU runs the package and its tests. Speed is secondary; the code
// follows the math: per (sequence, KV head) a tile of query rows walks the
// sequence's pages through the block table with an online softmax. The
// per-layer variants as on CUDA: a window (which keys a row sees, and from
// which page the walk starts), a soft-cap on the scaled scores (std::tanh), a
// sink per query head in the denominator (prefill; decode: split 0), and on
// decode a tree mask over the step's own tokens.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "checks.h"
#include "cpu_common.h"
#include "ops.h"

namespace tileinfer::cpu {
namespace {

using detail::from_float;
using detail::HostKV;
using detail::to_float;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Prefill splits a sequence's queries into tiles of this many tokens so that a
// long prompt still spreads over the threads.
constexpr int64_t kPrefillTileTokens = 16;

// Dot product with 8 independent partial sums: the compiler can vectorize it
// (a single running sum is a dependency chain it may not reorder), and the
// summation order is fixed, so the same inputs give the same bits every run.
inline float dot(const float* a, const float* b, int64_t d) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= d; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  for (; i < d; ++i) acc[0] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Keys and values of the first `count` slots of one page of one KV head,
// converted to fp32 into kf / vf [count, head_dim]. int8 / fp8: dequantized as
// the float64 reference does (k * k_scale * k_smooth, v * v_scale, in fp32), in
// this per-page scratch tile only: the pools are never rewritten.
template <typename cache_t>
void load_page(const HostKV& kv, int64_t page, int64_t kv_head, int64_t count, float* kf, float* vf) {
  const int64_t d = kv.s.head_dim;
  const int64_t base = kv.vec(page, kv_head, 0);
  const cache_t* k = static_cast<const cache_t*>(kv.k_cache) + base * d;
  const cache_t* v = static_cast<const cache_t*>(kv.v_cache) + base * d;
  if constexpr (std::is_same_v<cache_t, int8_t> || std::is_same_v<cache_t, c10::Float8_e4m3fn>) {
    const float* smooth = kv.k_smooth ? kv.k_smooth + kv_head * d : nullptr;
    for (int64_t c = 0; c < count; ++c) {
      const float ks = kv.k_scale[kv.scale_index(base + c)];
      const float vs = kv.v_scale[kv.scale_index(base + c)];
      for (int64_t i = 0; i < d; ++i) {
        float kx = static_cast<float>(k[c * d + i]) * ks;
        kf[c * d + i] = smooth ? kx * smooth[i] : kx;
        vf[c * d + i] = static_cast<float>(v[c * d + i]) * vs;
      }
    }
  } else {
    for (int64_t i = 0; i < count * d; ++i) {
      kf[i] = to_float(k[i]);
      vf[i] = to_float(v[i]);
    }
  }
}

// The per-layer variants of a call (window_left -1: none; soft_cap 0: none;
// sinks null: none).
struct Variants {
  int64_t window_left = -1;
  float soft_cap = 0.f;
  const float* sinks = nullptr;  // [num_q_heads]
  const int32_t* tree_mask = nullptr;  // [num_tokens] (decode only)

  // First key position a query at qpos sees (0 without a window).
  int64_t first_key(int64_t qpos) const {
    return window_left < 0 ? 0 : std::max<int64_t>(0, qpos - window_left);
  }
  // Page where a key walk for queries from position qpos on starts.
  int64_t first_page(int64_t qpos, int64_t page_size) const { return first_key(qpos) / page_size; }
};

// The online-softmax state of a tile of query rows: the rows of one KV head's
// query heads for some of a sequence's tokens, row = token_in_tile * group + head_in_group.
struct RowTile {
  int64_t rows = 0;
  int64_t d = 0;
  std::vector<float> q;        // [rows, d] queries, pre-multiplied by the softmax scale
  std::vector<int64_t> qpos;   // [rows] position of each row's query
  std::vector<uint32_t> tree;  // [rows] tree-mask word of each row's query (all ones: no mask)
  int64_t step_begin = 0;      // position of the step's first token (tree bit 0)
  std::vector<float> m;        // [rows] running max of the scaled scores
  std::vector<float> l;        // [rows] running sum of exp(score - m)
  std::vector<float> acc;      // [rows, d] running sum of exp(score - m) * v

  void reset(int64_t rows_, int64_t d_) {
    rows = rows_;
    d = d_;
    q.assign(rows * d, 0.f);
    qpos.assign(rows, 0);
    tree.assign(rows, ~0u);
    m.assign(rows, kNegInf);
    l.assign(rows, 0.f);
    acc.assign(rows * d, 0.f);
  }

  // Normalized output and natural-log lse of row r; a row that saw no
  // position gives 0 and -inf (the neutral partial), never NaN. `sink`: the
  // row's sink logit (-inf: none), one more term exp(sink) of the
  // denominator: out = acc e^(m - M) / (l e^(m - M) + e^(sink - M)) with
  // M = max(m, sink); lse includes it. A row that saw nothing but has a sink
  // gives 0 and lse = sink.
  template <typename out_t>
  void finish(int64_t r, out_t* out, float* lse, float sink = kNegInf) const {
    const float top = std::max(m[r], sink);
    const bool seen = top != kNegInf;
    const float f = m[r] == kNegInf ? 0.f : std::exp(m[r] - top);
    const float den = l[r] * f + (sink == kNegInf ? 0.f : std::exp(sink - top));
    const float inv = seen ? f / den : 0.f;
    for (int64_t i = 0; i < d; ++i) out[i] = from_float<out_t>(acc[r * d + i] * inv);
    if (lse) *lse = seen ? top + std::log(den) : kNegInf;
  }
};

// Scratch buffers of one thread.
struct Scratch {
  std::vector<float> kf, vf, scores;
  void reserve(int64_t page_size, int64_t d) {
    kf.resize(page_size * d);
    vf.resize(page_size * d);
    scores.resize(page_size);
  }
};

// Loads the queries of tokens [tok_begin, tok_end) of a sequence (its tokens
// start at seq_begin, it has n queries and len positions) for one KV head,
// with their tree-mask words (tree_mask null: none).
template <typename scalar_t>
void load_queries(RowTile& t, const at::Tensor& q, int64_t kv_head, int64_t group, int64_t seq_begin,
                  int64_t tok_begin, int64_t tok_end, int64_t n, int64_t len, float scale,
                  const int32_t* tree_mask = nullptr) {
  const int64_t d = q.size(2);
  t.reset((tok_end - tok_begin) * group, d);
  const scalar_t* qp = q.data_ptr<scalar_t>();
  for (int64_t tok = tok_begin; tok < tok_end; ++tok) {
    for (int64_t h = 0; h < group; ++h) {
      const int64_t r = (tok - tok_begin) * group + h;
      const scalar_t* src = qp + tok * q.stride(0) + (kv_head * group + h) * q.stride(1);
      for (int64_t i = 0; i < d; ++i) t.q[r * d + i] = to_float(src[i]) * scale;
      t.qpos[r] = len - n + (tok - seq_begin);
      if (tree_mask) t.tree[r] = static_cast<uint32_t>(tree_mask[tok]);
    }
  }
  t.step_begin = len - n;
}

// Attends every row of the tile to pages [page_begin, page_end) of a sequence
// holding len positions. Pages whose id lies outside the pool are skipped.
template <typename cache_t>
void attend_pages(const HostKV& kv, int64_t seq, int64_t kv_head, int64_t len, int64_t page_begin,
                  int64_t page_end, bool causal, const Variants& var, RowTile& t, Scratch& sc) {
  const int64_t ps = kv.s.page_size;
  const int64_t d = kv.s.head_dim;
  for (int64_t j = page_begin; j < page_end; ++j) {
    const int64_t pos0 = j * ps;
    const int64_t count = std::min(ps, len - pos0);
    if (count <= 0) break;
    const int64_t page = kv.page_of(seq, j);
    if (page < 0) continue;
    load_page<cache_t>(kv, page, kv_head, count, sc.kf.data(), sc.vf.data());
    for (int64_t r = 0; r < t.rows; ++r) {
      // Causal: the row sees positions <= its own; only the diagonal page cuts.
      // Window: and positions from first_key on; only the window's edge cuts.
      const int64_t visible = causal ? std::min(count, t.qpos[r] - pos0 + 1) : count;
      const int64_t first = std::max<int64_t>(0, var.first_key(t.qpos[r]) - pos0);
      if (visible <= first) continue;
      // Tree: the step's token j (position step_begin + j) is seen when bit j
      // of the row's word is set (bits past 31 do not exist: seen).
      auto tree_hides = [&](int64_t pos) {
        const int64_t j = pos - t.step_begin;
        return j >= 0 && j < 32 && !((t.tree[r] >> j) & 1u);
      };
      const float* qr = &t.q[r * d];
      float mx = kNegInf;
      bool any = false;
      for (int64_t c = first; c < visible; ++c) {
        if (tree_hides(pos0 + c)) {
          sc.scores[c] = kNegInf;
          continue;
        }
        float sc_c = dot(qr, &sc.kf[c * d], d);  // scale * q . k
        if (var.soft_cap > 0.f) sc_c = var.soft_cap * std::tanh(sc_c / var.soft_cap);
        sc.scores[c] = sc_c;
        mx = std::max(mx, sc_c);
        any = true;
      }
      if (!any) continue;  // the tree hid every key of the page from this row
      const float m_new = std::max(t.m[r], mx);
      const float alpha = std::exp(t.m[r] - m_new);  // 0 on the first page the row sees
      float* acc = &t.acc[r * d];
      float l = t.l[r] * alpha;
      for (int64_t i = 0; i < d; ++i) acc[i] *= alpha;
      for (int64_t c = first; c < visible; ++c) {
        if (sc.scores[c] == kNegInf) continue;  // hidden by the tree
        const float p = std::exp(sc.scores[c] - m_new);
        l += p;
        const float* vr = &sc.vf[c * d];
        for (int64_t i = 0; i < d; ++i) acc[i] += p * vr[i];
      }
      t.l[r] = l;
      t.m[r] = m_new;
    }
  }
}

int64_t pages_for(int64_t len, int64_t page_size) { return (len + page_size - 1) / page_size; }

// One unit of parallel work: some tokens of one sequence, one KV head, one split.
struct WorkItem {
  int64_t seq, kv_head, split, tok_begin, tok_end;
};

template <typename scalar_t, typename cache_t>
void prefill_impl(at::Tensor& out, float* lse, const at::Tensor& q, const HostKV& kv, float scale,
                  bool causal, const Variants& var) {
  const auto& s = kv.s;
  const int64_t hq = q.size(1);
  const int64_t group = hq / s.num_kv_heads;
  std::vector<WorkItem> items;
  for (int64_t seq = 0; seq < s.num_seqs; ++seq)
    for (int64_t b = kv.cu_seqlens_q[seq]; b < kv.cu_seqlens_q[seq + 1]; b += kPrefillTileTokens)
      for (int64_t g = 0; g < s.num_kv_heads; ++g)
        items.push_back({seq, g, 0, b, std::min<int64_t>(b + kPrefillTileTokens, kv.cu_seqlens_q[seq + 1])});

  scalar_t* op = out.data_ptr<scalar_t>();
  at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t begin, int64_t end) {
    RowTile t;
    Scratch sc;
    sc.reserve(s.page_size, s.head_dim);
    for (int64_t w = begin; w < end; ++w) {
      const WorkItem& it = items[w];
      const int64_t seq_begin = kv.cu_seqlens_q[it.seq];
      const int64_t n = kv.cu_seqlens_q[it.seq + 1] - seq_begin;
      const int64_t len = kv.seq_lens[it.seq];
      load_queries<scalar_t>(t, q, it.kv_head, group, seq_begin, it.tok_begin, it.tok_end, n, len, scale);
      // From the page of the first key that the item's first query sees.
      const int64_t first_page = var.first_page(len - n + (it.tok_begin - seq_begin), s.page_size);
      attend_pages<cache_t>(kv, it.seq, it.kv_head, len, first_page, pages_for(len, s.page_size), causal, var, t,
                            sc);
      for (int64_t tok = it.tok_begin; tok < it.tok_end; ++tok)
        for (int64_t h = 0; h < group; ++h) {
          const int64_t head = it.kv_head * group + h;
          t.finish((tok - it.tok_begin) * group + h, op + tok * out.stride(0) + head * out.stride(1),
                   lse ? lse + tok * hq + head : nullptr, var.sinks ? var.sinks[head] : kNegInf);
        }
    }
  });
}

template <typename scalar_t, typename cache_t>
void decode_impl(float* partial_out, float* partial_lse, const DecodePlan& plan, const at::Tensor& q,
                 const HostKV& kv, float scale, bool causal, const Variants& var) {
  const int64_t num_splits = plan.num_splits;
  const auto& s = kv.s;
  const int64_t num_tokens = q.size(0);
  const int64_t hq = q.size(1);
  const int64_t d = s.head_dim;
  const int64_t group = hq / s.num_kv_heads;
  std::vector<WorkItem> items;
  for (int64_t split = 0; split < num_splits; ++split)
    for (int64_t seq = 0; seq < s.num_seqs; ++seq)
      if (kv.cu_seqlens_q[seq + 1] > kv.cu_seqlens_q[seq])
        for (int64_t g = 0; g < s.num_kv_heads; ++g)
          items.push_back({seq, g, split, kv.cu_seqlens_q[seq], kv.cu_seqlens_q[seq + 1]});

  at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t begin, int64_t end) {
    RowTile t;
    Scratch sc;
    sc.reserve(s.page_size, d);
    for (int64_t w = begin; w < end; ++w) {
      const WorkItem& it = items[w];
      const int64_t n = it.tok_end - it.tok_begin;
      const int64_t len = kv.seq_lens[it.seq];
      // Split i takes pages F + [i * m, (i + 1) * m) of the sequence's P
      // pages from page F on (F: the page of the first key that the step's
      // first query sees, 0 without a window; m = pages_per_split, ceil(P / S)
      // by default); the later splits of a short sequence get none and write
      // the neutral partial (out = 0, lse = -inf). The sink joins split 0's
      // partial only.
      const int64_t num_pages = pages_for(len, s.page_size);
      const int64_t first_page = std::min(num_pages, var.first_page(len - n, s.page_size));
      const int64_t per_split = pages_per_split(num_pages - first_page, plan.divisor, plan.min_pages);
      const int64_t pb = std::min(num_pages, first_page + it.split * per_split);
      const int64_t pe = std::min(num_pages, pb + per_split);
      load_queries<scalar_t>(t, q, it.kv_head, group, it.tok_begin, it.tok_begin, it.tok_end, n, len, scale,
                             var.tree_mask);
      attend_pages<cache_t>(kv, it.seq, it.kv_head, len, pb, pe, causal, var, t, sc);
      for (int64_t tok = it.tok_begin; tok < it.tok_end; ++tok)
        for (int64_t h = 0; h < group; ++h) {
          const int64_t head = it.kv_head * group + h;
          const int64_t row = (it.split * num_tokens + tok) * hq + head;
          const float sink = var.sinks && it.split == 0 ? var.sinks[head] : kNegInf;
          t.finish((tok - it.tok_begin) * group + h, partial_out + row * d, partial_lse + row, sink);
        }
    }
  });

  // Tokens of no sequence (padding past cu_seqlens_q[num_seqs]) get neutral
  // partials, so that combine turns them into zeros instead of reading garbage.
  const int64_t owned = kv.cu_seqlens_q[s.num_seqs];
  for (int64_t split = 0; split < num_splits; ++split)
    for (int64_t tok = owned; tok < num_tokens; ++tok)
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t row = (split * num_tokens + tok) * hq + h;
        std::fill(partial_out + row * d, partial_out + (row + 1) * d, 0.f);
        partial_lse[row] = kNegInf;
      }
}

Variants variants(int64_t window_left, double logits_soft_cap, const std::optional<at::Tensor>& sinks,
                  const std::optional<at::Tensor>& tree_mask = std::nullopt) {
  return {window_left, static_cast<float>(logits_soft_cap), sinks.has_value() ? sinks->data_ptr<float>() : nullptr,
          tree_mask.has_value() ? tree_mask->data_ptr<int32_t>() : nullptr};
}

// Runs fn.template operator()<scalar_t, cache_t>() for q's element type and the pool's.
template <typename Fn>
void dispatch_q_and_cache(const char* op, const at::Tensor& q, const PagedShape& s, Fn&& fn) {
  TILEINFER_CPU_DISPATCH_FLOAT(q.scalar_type(), op, [&] {
    if (s.fp8) {
      fn.template operator()<scalar_t, c10::Float8_e4m3fn>();
    } else if (s.quantized) {
      fn.template operator()<scalar_t, int8_t>();
    } else {
      fn.template operator()<scalar_t, scalar_t>();
    }
  });
}

}  // namespace

void prefill_as(const char* op, at::Tensor& out, const std::optional<at::Tensor>& lse, const at::Tensor& q,
                const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& block_tables,
                const at::Tensor& seq_lens, const at::Tensor& cu_seqlens_q, int64_t max_q_len, double scale,
                bool causal, const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                const std::optional<at::Tensor>& k_smooth, int64_t window_left, double logits_soft_cap,
                const std::optional<at::Tensor>& sinks) {
  const PagedShape s = check_paged_attention(op, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
                                             max_q_len, k_scale, v_scale, k_smooth);
  check_variants(op, window_left, logits_soft_cap, sinks, q.size(1), q.device());
  check_token_tensor(op, "out", out, q.size(0), q.size(1), s.head_dim, q.scalar_type(), q.device());
  if (lse.has_value()) check_lse(op, "lse", *lse, q.size(0), q.size(1), q.device());
  check_metadata_values_on_host(op, s, seq_lens, cu_seqlens_q, q.size(0), max_q_len);
  const HostKV kv = detail::host_kv(s, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_scale, v_scale,
                                    k_smooth);
  float* lse_ptr = lse.has_value() ? lse->data_ptr<float>() : nullptr;
  const Variants var = variants(window_left, logits_soft_cap, sinks);
  dispatch_q_and_cache(op, q, s, [&]<typename scalar_t, typename cache_t>() {
    prefill_impl<scalar_t, cache_t>(out, lse_ptr, q, kv, static_cast<float>(scale), causal, var);
  });
}

void decode_as(const char* op, at::Tensor& partial_out, at::Tensor& partial_lse, const at::Tensor& q,
               const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& block_tables,
               const at::Tensor& seq_lens, const at::Tensor& cu_seqlens_q, int64_t max_q_len, double scale,
               bool causal, const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
               const std::optional<at::Tensor>& k_smooth, int64_t window_left, double logits_soft_cap,
               const std::optional<at::Tensor>& sinks, const std::optional<at::Tensor>& tree_mask,
               const DecodePlan& plan) {
  const PagedShape s = check_paged_attention(op, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
                                             max_q_len, k_scale, v_scale, k_smooth);
  check_variants(op, window_left, logits_soft_cap, sinks, q.size(1), q.device());
  check_decode_max_q_len(op, max_q_len);
  check_tree_mask(op, tree_mask, q.size(0), max_q_len, q.device());
  check_decode_partials(op, partial_out, partial_lse, q, s.head_dim);
  TILEINFER_CHECK(plan.num_splits == partial_out.size(0), op, ": the decode plan has ", plan.num_splits,
                  " splits for ", partial_out.size(0), " partials");
  check_metadata_values_on_host(op, s, seq_lens, cu_seqlens_q, q.size(0), max_q_len);
  const HostKV kv = detail::host_kv(s, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_scale, v_scale,
                                    k_smooth);
  float* po = partial_out.data_ptr<float>();
  float* pl = partial_lse.data_ptr<float>();
  const Variants var = variants(window_left, logits_soft_cap, sinks, tree_mask);
  dispatch_q_and_cache(op, q, s, [&]<typename scalar_t, typename cache_t>() {
    decode_impl<scalar_t, cache_t>(po, pl, plan, q, kv, static_cast<float>(scale), causal, var);
  });
}

// lse_gated changes nothing here: a partial of weight 0 is never read.
void combine_as(const char* op, at::Tensor& out, const std::optional<at::Tensor>& lse,
                const at::Tensor& partial_out, const at::Tensor& partial_lse, bool /*lse_gated*/) {
  check_combine(op, out, lse, partial_out, partial_lse);
  const int64_t splits = partial_out.size(0);
  const int64_t num_tokens = partial_out.size(1);
  const int64_t heads = partial_out.size(2);
  const int64_t d = partial_out.size(3);
  const float* po = partial_out.data_ptr<float>();
  const float* pl = partial_lse.data_ptr<float>();
  float* lse_ptr = lse.has_value() ? lse->data_ptr<float>() : nullptr;

  TILEINFER_CPU_DISPATCH_FLOAT(out.scalar_type(), op, [&] {
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, num_tokens * heads, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> acc(d);
      for (int64_t row = begin; row < end; ++row) {
        const int64_t tok = row / heads, h = row % heads;
        scalar_t* dst = o + tok * out.stride(0) + h * out.stride(1);
        // M = max_i lse_i; out = sum_i w_i out_i / sum_i w_i with w_i = exp(lse_i - M),
        // merged in split order: deterministic. Neutral partials have w_i = 0.
        float mx = kNegInf;
        for (int64_t i = 0; i < splits; ++i) mx = std::max(mx, pl[i * num_tokens * heads + row]);
        if (mx == kNegInf) {
          for (int64_t c = 0; c < d; ++c) dst[c] = from_float<scalar_t>(0.f);
          if (lse_ptr) lse_ptr[row] = kNegInf;
          continue;
        }
        std::fill(acc.begin(), acc.end(), 0.f);
        float den = 0.f;
        for (int64_t i = 0; i < splits; ++i) {
          const int64_t pr = i * num_tokens * heads + row;
          const float w = std::exp(pl[pr] - mx);
          if (w == 0.f) continue;
          den += w;
          for (int64_t c = 0; c < d; ++c) acc[c] += w * po[pr * d + c];
        }
        const float inv = 1.f / den;
        for (int64_t c = 0; c < d; ++c) dst[c] = from_float<scalar_t>(acc[c] * inv);
        if (lse_ptr) lse_ptr[row] = mx + std::log(den);
      }
    });
  });
}

void prefill(at::Tensor& out, const std::optional<at::Tensor>& lse, const at::Tensor& q, const at::Tensor& k_cache,
             const at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& seq_lens,
             const at::Tensor& cu_seqlens_q, int64_t max_q_len, double scale, bool causal,
             const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
             const std::optional<at::Tensor>& k_smooth, int64_t window_left, double logits_soft_cap,
             const std::optional<at::Tensor>& sinks, const std::optional<at::Tensor>& tree_mask) {
  check_no_tree_mask("prefill", tree_mask);
  prefill_as("prefill", out, lse, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, max_q_len, scale,
             causal, k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks);
}

void decode(at::Tensor& partial_out, at::Tensor& partial_lse, const at::Tensor& q, const at::Tensor& k_cache,
            const at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& seq_lens,
            const at::Tensor& cu_seqlens_q, int64_t max_q_len, double scale, bool causal,
            const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
            const std::optional<at::Tensor>& k_smooth, int64_t window_left, double logits_soft_cap,
            const std::optional<at::Tensor>& sinks, const std::optional<at::Tensor>& tree_mask) {
  const int64_t splits = partial_out.dim() > 0 ? partial_out.size(0) : 1;  // (checked in decode_as)
  decode_as("decode", partial_out, partial_lse, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
            max_q_len, scale, causal, k_scale, v_scale, k_smooth, window_left, logits_soft_cap, sinks, tree_mask,
            even_decode_plan(splits));
}

void combine(at::Tensor& out, const std::optional<at::Tensor>& lse, const at::Tensor& partial_out,
             const at::Tensor& partial_lse) {
  combine_as("combine", out, lse, partial_out, partial_lse, false);
}

}  // namespace tileinfer::cpu

TORCH_LIBRARY_IMPL(tileinfer_attn, CPU, m) {
  m.impl("prefill", &tileinfer::cpu::prefill);
  m.impl("decode", &tileinfer::cpu::decode);
  m.impl("combine", &tileinfer::cpu::combine);
}
