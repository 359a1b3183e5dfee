"""Serving soak: seeded random schedules of a few thousand steps, as
a serving engine sends them, over PagedKVCache (8 configurations x 500 steps:
bf16 and fp32 caches, int8 and fp8 caches with per-vector scales, and the
per-layer variants over a bf16 and an fp8 per-tensor cache) and over the
model runner (4 x 200 steps: fp32, bf16, and bf16 over an int8 and an fp8
per-tensor cache). Each case also asserts that its
schedule reached what it is meant to exercise (refusals, forks, mixed steps,
padded steps, verifies with rejected drafts, ...), so a change that quietly
stops them fails.

Cache soak (test_cache_soak): sequences are added, prefilled in chunks of
1-64 tokens, decoded, verified (speculative steps of 2-16 queries of which a
random prefix of 1..n is accepted), forked and freed, under a pool small
enough that the allocator runs out of pages (and of slots, and of
max_pages_per_seq) all the time. A refusal must change nothing (lengths,
pages, free count, device rows); the schedule then preempts a sequence,
drops one from the step or skips the step. Steps mix prefill chunks with
decodes and verifies in one ``attention`` call, sequences in random order in
``cu_seqlens_q``, some scheduled with no query, and some steps go through
``AttentionMetadata.static(...).update_`` with padded slots (length 0, no
query), padding tokens past ``cu_seqlens_q[-1]`` and a ``max_q_len`` bound
above the step's (a graph's token budget), causal and (rarely) non-causal.
The steps reach the cache three ways: ``prepare_step`` (appending),
``append`` per sequence then ``prepare_step(append=False)``, and, for steps
with verifies, ``reserve`` + metadata built from the cache's device rows +
``append`` of the accepted prefix only: PagedKVCache has no rollback, so a
verify reserves the pages of its drafts and commits what is accepted (the
rejected positions stay reserved and are overwritten by the next step).
Every step writes k/v into both layers (cache_write; a quantized cache with
random key smoothing factors, per tensor with fixed scales that some keys
saturate) and runs ``attention`` on one, in the variant cases with a window,
a soft-cap and sinks drawn per step; its output is compared with
reference.paged_attention(exact=True) on the same cache and variants (bounds
of op_helpers.check_out: 4 ulps bf16, 6 over a quantized cache on the GPU,
as tests/test_int8_gpu.py, 1e-5 relative fp32), NaN-free, padding rows 0 or
untouched; a quarter of the steps run again with ``batch_invariant=True``,
and one of their sequences alone must give its rows' bits. After every step the allocator
invariants are checked: each page's refcount is its number of owners, a page
has two owners only when fork shared it (the same full page index in each,
never written again), free count = pages owned by nobody, each sequence
holds ceil(max(length, reserved) / page) pages, device block_tables /
seq_lens rows equal the host's (unused entries page 0, free slots all 0),
and the cached k/v of every live sequence equals a host shadow of what was
written at its committed positions (a quantized cache's bytes and per-vector
scales as reference.quantize gives them), so a page shared or reused by
mistake, or a fork that copies a page without its scales, shows even where
the reference, reading the same pages, would agree.

The soak found one bug: prepare_step checked max_pages_per_seq only while
appending, after the sequences before the offending one had been extended
(and their device rows left stale). Fixed in cache.py; the regression test is
test_prepare_step_past_max_pages_per_seq_changes_nothing below.

Runner soak (test_runner_soak): a Qwen3-style model on our ops against the
same weights on the eager reference backend (logits every step; a quantized
cache on both sides), over random
prefill chunks, decodes, verifies (accepting a random prefix: PagedRunner has
no accept call, so the test advances ``runner.lens``, which
``step(commit=False)`` leaves alone), non-causal drafting steps (nothing
committed), idle slots (in the step with no token) and finished slots
restarted; when a sequence finishes, the logits of its last committed token
are compared with one prefill of its committed history on a fresh runner.
PagedRunner gives each slot a fixed set of pages and always sends slots in
order, so fork / free / out-of-pages and random cu_seqlens order are the
cache soak's part. Steps with no token at all are skipped here (no engine
sends one to a model); the attention layer's 0-token step is tested in
tests/test_model.py.

CUDA graphs: the runner soak captures two steps (``PagedRunner.capture``):
the whole batch's decode step (max_q_len 1), through which half of the
all-decode steps replay, and one at the schedule's token budget, through
which half of the other causal steps replay whatever their mix (prompt
chunks, decodes, verifies, idle slots); the rest run eagerly, and the
reference model always does. Without a GPU the same static buffers run
eagerly (padded tokens and slots, max_q_len at the budget). The cache soak
runs eagerly. The CUDA cases skip where there is no CUDA device.
"""
import copy
import dataclasses
import random
from collections import Counter
from dataclasses import dataclass
from typing import Optional

import pytest
import torch

import tileinfer_attn as ti
from tileinfer_attn import reference as R
from tileinfer_attn.cache import CacheFullError, PagedKVCache
from tileinfer_attn.metadata import AttentionMetadata
from tileinfer_attn.models.qwen3 import Qwen3Config, Qwen3Model
from tileinfer_attn.models.runner import PagedRunner
from tileinfer_attn.testing import poison_
from op_helpers import DEVICES, bits, check_out, need

ops = torch.ops.tileinfer_attn

PAGE = 16
HEAD_DIM = 64
LAYERS = 2
SCALE = HEAD_DIM ** -0.5


@dataclass
class Seq:
    """The schedule's view of a live sequence (what the cache must agree with)."""
    length: int         # committed positions
    prompt: int         # prefilled in chunks until length reaches it
    target: int         # freed when length reaches it (may exceed what max_pages_per_seq allows)
    reserved: int       # positions with pages (>= length: a verify reserves its drafts)
    shared: int         # its pages [0, shared) may be shared by fork
    kv: torch.Tensor    # [max positions, 2 (k, v), layers, kv heads, head_dim]: what the cache must
    #                     hold (host): the elements written, or a quantized cache's bytes as uint8
    scales: Optional[torch.Tensor] = None  # [max positions, 2, layers, kv heads]: per-vector scales

    def clone(self, **change):
        return dataclasses.replace(self, kv=self.kv.clone(),
                                   scales=None if self.scales is None else self.scales.clone(), **change)


class CacheSoak:
    """dtype: the queries' and written keys' / values' type; cache: the
    cache's element type (dtype by default) and scale kind; variants: each
    step draws a window, a soft-cap and sinks (each some of the time)."""

    def __init__(self, device, dtype, num_q_heads, num_kv_heads, seed, num_pages=80, max_seqs=12,
                 max_pages_per_seq=16, cache=None, scale="vector", variants=False):
        self.device, self.dtype, self.seed = torch.device(device), dtype, seed
        self.hq, self.hkv = num_q_heads, num_kv_heads
        self.cache = PagedKVCache(LAYERS, num_pages, num_kv_heads, HEAD_DIM, PAGE, cache or dtype, device, max_seqs,
                                  max_pages_per_seq, scale=scale)
        self.variants = variants
        c = self.cache
        if c.quantized:
            gen = torch.Generator().manual_seed(seed + 1000)
            c.k_smooth.copy_(torch.rand(c.k_smooth.shape, generator=gen) * 1.5 + 0.5)
            if scale == "tensor":  # the caller's scales (vLLM's k_scale / v_scale): keys up to ~5.6
                c.k_scales.fill_(0.0125)
                c.v_scales.fill_(0.01)
        # ulps of bf16 against float64 (op_helpers.ULPS); the CUDA kernels over a
        # quantized cache also round q * k_smooth and p * v_scale: 6
        # (tests/test_int8_gpu.py says why).
        self.ulps = 6 if c.quantized and self.device.type == "cuda" else 4
        self.max_pos = max_pages_per_seq * PAGE
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.seqs = {}
        self.stats = Counter()
        self.step_no = 0

    # ------------------------------------------------------------------ helpers
    def where(self):
        return f"seed {self.seed} step {self.step_no}"

    def pages_for(self, positions):
        return -(-positions // PAGE)

    def snapshot(self):
        c = self.cache
        return ({s: (c.pages(s), c.seq_len(s)) for s in c.seqs}, c.num_free_pages, c.num_free_seqs,
                [c.refcount(p) for p in range(c.num_pages)], c.block_tables.cpu().clone(), c.seq_lens.cpu().clone())

    def assert_unchanged(self, snap, what):
        now = self.snapshot()
        assert now[:4] == snap[:4], f"{self.where()}: refused {what} changed the allocator"
        assert torch.equal(now[4], snap[4]) and torch.equal(now[5], snap[5]), \
            f"{self.where()}: refused {what} changed the device rows"

    def randn(self, *shape):
        return torch.randn(*shape, generator=self.gen).to(self.dtype)

    # ------------------------------------------------------------------ lifecycle
    def try_add(self):
        r, c = self.rng, self.cache
        snap = self.snapshot()
        try:
            s = c.add()
        except CacheFullError as e:
            assert c.num_free_seqs == 0 and "slots" in str(e), f"{self.where()}: add refused: {e}"
            self.assert_unchanged(snap, "add")
            self.stats["add_refused"] += 1
            return
        assert snap[2] > 0, f"{self.where()}: add succeeded with no free slot"
        # Some prompts (1 in 10) or generations (1 in 10) run past max_pages_per_seq:
        # the cache must refuse that step cleanly (the sequence is then freed).
        if r.random() < 0.1:
            prompt = r.randint(self.max_pos - 40, self.max_pos + 60)
        else:
            prompt = r.choice([r.randint(1, 24), r.randint(24, 200), r.randint(200, self.max_pos - 40)])
        target = prompt + (r.randint(1, 100) if r.random() < 0.9 else self.max_pos)
        quant, per_vector = self.cache.quantized, self.cache.scale == "vector"
        kv = torch.zeros(self.max_pos, 2, LAYERS, self.hkv, HEAD_DIM, dtype=torch.uint8 if quant else self.dtype)
        scales = torch.zeros(self.max_pos, 2, LAYERS, self.hkv) if quant and per_vector else None
        self.seqs[s] = Seq(0, prompt, target, 0, 0, kv, scales)
        self.stats["add"] += 1

    def try_fork(self):
        r, c = self.rng, self.cache
        parents = [s for s, q in self.seqs.items() if q.length > 0]
        if not parents:
            return
        s = r.choice(parents)
        q = self.seqs[s]
        full, partial = divmod(q.length, PAGE)
        refuse = c.num_free_seqs == 0 or (partial > 0 and c.num_free_pages == 0)
        snap = self.snapshot()
        try:
            child = c.fork(s)
        except CacheFullError:
            assert refuse, f"{self.where()}: fork refused although a slot and a page were free"
            self.assert_unchanged(snap, "fork")
            self.stats["fork_refused"] += 1
            return
        assert not refuse, f"{self.where()}: fork succeeded without a free slot or page"
        assert c.num_free_pages == snap[1] - (partial > 0), f"{self.where()}: fork took the wrong number of pages"
        assert c.pages(child)[:full] == c.pages(s)[:full]
        if partial:
            assert c.pages(child)[full] != c.pages(s)[full], f"{self.where()}: fork shared a partial page"
        q.shared = max(q.shared, full)
        self.seqs[child] = q.clone(target=q.length + r.randint(1, 80), reserved=q.length, shared=full)
        self.stats["fork"] += 1

    def free(self, s, why):
        c = self.cache
        before = c.num_free_pages
        released = sum(c.refcount(p) == 1 for p in c.pages(s))
        c.free(s)
        del self.seqs[s]
        assert c.num_free_pages == before + released, f"{self.where()}: free released the wrong pages"
        self.stats[why] += 1

    # ------------------------------------------------------------------ one step
    def plan(self):
        """[(seq, queries, accepted)] in random order, within a token budget."""
        r = self.rng
        live = list(self.seqs)
        r.shuffle(live)
        budget = r.choice([16, 64, 160])
        decode_only = r.random() < 0.3
        plan, used = [], 0
        for s in live:
            q = self.seqs[s]
            if r.random() < 0.1:
                plan.append((s, 0, 0))  # scheduled with no query
                continue
            if q.length < q.prompt:
                if decode_only:
                    continue
                n = min(q.prompt - q.length, r.randint(1, 64), budget - used)
                acc = n
            elif r.random() < 0.25:
                n = r.randint(2, 16)
                acc = n if r.random() < 0.4 else r.randint(1, n - 1)  # all drafts accepted, or a prefix
            else:
                n = acc = 1
            if n <= 0 or used + n > budget:
                continue
            plan.append((s, n, acc))
            used += n
        return plan

    def refused(self, plan, e, what):
        """After a refused step: free the sequences past max_pages_per_seq, or
        preempt one, drop one from the step, or skip the step. The new plan."""
        r, c = self.rng, self.cache
        over = [s for s, n, _ in plan if self.pages_for(self.seqs[s].length + n) > c.max_pages_per_seq]
        if over:
            assert "max_pages_per_seq" in str(e), f"{self.where()}: {what} refused for another reason: {e}"
            for s in over:
                self.free(s, "freed_at_length_limit")
            self.stats[f"{what}_length_limit"] += 1
            return [x for x in plan if x[0] not in over]
        assert "out of pages" in str(e), f"{self.where()}: {what} refused: {e}"
        choice = r.random()
        if choice < 0.4:
            victim = r.choice(list(self.seqs))
            self.free(victim, "preempted")
            return [x for x in plan if x[0] != victim]
        if choice < 0.8:
            drop = max(plan, key=lambda x: self.pages_for(self.seqs[x[0]].length + x[1]) - len(c.pages(x[0])))
            self.stats["dropped_from_step"] += 1
            return [x for x in plan if x is not drop]
        self.stats["skipped_step"] += 1
        return []

    def new_pages(self, plan):
        """Pages that extending the plan's sequences by their query counts allocates."""
        held = lambda q: self.pages_for(max(q.length, q.reserved))  # noqa: E731
        return sum(max(0, self.pages_for(self.seqs[s].length + n) - held(self.seqs[s])) for s, n, _ in plan)

    def predicted_refusal(self, plan):
        c = self.cache
        if any(self.pages_for(self.seqs[s].length + n) > c.max_pages_per_seq for s, n, _ in plan):
            return True
        return self.new_pages(plan) > c.num_free_pages

    def metadata(self, plan, causal):
        """(metadata, plan, route) of the step, through one of the cache's three
        paths; metadata None if the step ends up empty. Lengths in self.seqs stay
        those before the step."""
        r, c = self.rng, self.cache
        verify = any(acc < n for _, n, acc in plan)
        route = "reserve" if verify else ("prepare" if r.random() < 0.7 else "append")
        for _ in range(4):
            if not plan:
                return None, plan, route
            seqs, ns = [s for s, _, _ in plan], [n for _, n, _ in plan]
            if route == "prepare":
                refuse = self.predicted_refusal(plan)
                snap = self.snapshot()
                try:
                    md = c.prepare_step(seqs, ns, causal=causal)
                except CacheFullError as e:
                    assert refuse, f"{self.where()}: prepare_step refused a step that fits: {e}"
                    self.assert_unchanged(snap, "prepare_step")
                    self.stats["step_refused"] += 1
                    plan = self.refused(plan, e, "prepare_step")
                    continue
                assert not refuse, f"{self.where()}: prepare_step accepted a step that does not fit"
                self.stats["route_prepare"] += 1
                return md, plan, route
            # append / reserve: one sequence at a time; a refused one leaves the step.
            kept = []
            for item in plan:
                s, n, _ = item
                if s not in self.seqs:  # preempted while resolving an earlier refusal
                    continue
                refuse = self.predicted_refusal([item])
                snap = self.snapshot()
                try:
                    (c.append if route == "append" else c.reserve)(s, n)
                except CacheFullError as e:
                    assert refuse, f"{self.where()}: {route} refused although it fits: {e}"
                    self.assert_unchanged(snap, route)
                    self.stats[f"{route}_refused"] += 1
                    self.refused([item], e, route)
                    continue
                assert not refuse, f"{self.where()}: {route} accepted what does not fit"
                q = self.seqs[s]
                q.reserved = max(q.reserved, q.length + n)
                kept.append(item)
            plan = [x for x in kept if x[0] in self.seqs]
            if not plan:
                return None, plan, route
            seqs, ns = [s for s, _, _ in plan], [n for _, n, _ in plan]
            if route == "append":
                self.stats["route_append"] += 1
                return c.prepare_step(seqs, ns, causal=causal, append=False), plan, route
            self.stats["route_reserve"] += 1
            idx = torch.tensor(seqs, device=self.device)
            lens = [self.seqs[s].length + n for s, n in zip(seqs, ns)]
            return AttentionMetadata.build(c.block_tables.index_select(0, idx), lens, ns, self.device,
                                           causal=causal), plan, route
        return None, [], route

    def step(self):
        r, c = self.rng, self.cache
        self.step_no += 1
        if r.random() < 0.35:
            self.try_add()
        if r.random() < 0.1:
            self.try_fork()
        if self.seqs and r.random() < 0.02:
            self.free(r.choice(list(self.seqs)), "preempted")
        causal = r.random() > 0.05
        md, plan, route = self.metadata(self.plan(), causal)
        if md is not None:
            self.run(md, plan, causal, route)
        for s in [s for s, q in self.seqs.items() if q.length >= q.target]:
            self.free(s, "finished")
        self.check_invariants()

    def run(self, md, plan, causal, route):
        r, c, dev = self.rng, self.cache, self.device
        ns = [n for _, n, _ in plan]
        tokens = sum(ns)
        if all(n <= 16 for n in ns):
            self.stats["decode_verify_only"] += 1
        elif any(0 < n <= 16 for n in ns):
            self.stats["mixed"] += 1
        self.stats["verify"] += sum(n > 1 and self.seqs[s].length >= self.seqs[s].prompt for s, n, _ in plan)
        self.stats["rejected_drafts"] += sum(acc < n for _, n, acc in plan)
        pad = 0
        if r.random() < 0.3:
            # Padded slots, padding tokens and a max_q_len bound: a graph's static buffers.
            bound = r.choice([md.max_q_len, max(md.max_q_len, 16), max(md.max_q_len, 160)])
            static = AttentionMetadata.static(len(plan) + r.randint(1, 4), c.max_pages_per_seq, bound, dev, causal)
            md = static.update_(md)
            pad = r.randint(0, 8)
            self.stats["padded"] += 1
        bt, sl, cu = md.block_tables, md.seq_lens, md.cu_seqlens_q
        k = self.randn(LAYERS, tokens + pad, self.hkv, HEAD_DIM)
        v = self.randn(LAYERS, tokens + pad, self.hkv, HEAD_DIM)
        for layer in range(LAYERS):
            kc, vc = c.layer_cache(layer)[:2]
            ti.cache_write(kc, vc, k[layer].to(dev), v[layer].to(dev), bt, sl, cu, **c.quant_kwargs(layer))
        layer = r.randrange(LAYERS)
        kc, vc = c.layer_cache(layer)[:2]
        kw = dict(**c.quant_kwargs(layer), **self.draw_variants())
        q = self.randn(tokens + pad, self.hq, HEAD_DIM).to(dev)
        out = poison_(torch.empty_like(q))
        ops.attention(out, q, kc, vc, bt, sl, cu, md.max_q_len, SCALE, causal, **kw)
        exact = R.paged_attention(q, kc, vc, bt, sl, cu, md.max_q_len, SCALE, causal, exact=True, **kw)
        what = (f"{self.where()}: attention, q_lens {ns}, causal {causal}, max_q_len {md.max_q_len}, pad {pad}, "
                f"window_left {kw.get('window_left', -1)}, soft-cap {kw.get('logits_soft_cap', 0.0)}, "
                f"sinks {kw.get('sinks') is not None}")
        if tokens:
            check_out(out[:tokens], exact[:tokens], self.dtype, what, self.ulps)
        rest = out[tokens:]
        assert torch.all(rest == 0) or torch.all(torch.isnan(rest)), f"{what}: padding rows neither 0 nor untouched"
        if tokens and r.random() < 0.25:
            self.check_batch_invariant(q, kc, vc, md, plan, causal, exact, what, kw)
        # Commit: the accepted prefix of each sequence's tokens.
        start = 0
        for s, n, acc in plan:
            q_ = self.seqs[s]
            for i, x in enumerate((k, v)):
                stored, scales = self.stored(x[:, start:start + acc], key=i == 0)
                q_.kv[q_.length:q_.length + acc, i] = stored
                if q_.scales is not None:
                    q_.scales[q_.length:q_.length + acc, i] = scales
            start += n
            if route == "reserve":  # the pages were reserved: committing allocates none
                free = c.num_free_pages
                c.append(s, acc)
                assert c.num_free_pages == free, f"{self.where()}: committing reserved positions took pages"
            q_.length += acc
            q_.reserved = max(q_.reserved, q_.length)

    def draw_variants(self):
        """This step's per-layer variants (none unless the case has them):
        a window, a soft-cap and sinks, each in some of the steps."""
        r = self.rng
        if not self.variants:
            return {}
        kw = {}
        if r.random() < 0.4:
            kw["window_left"] = r.choice([0, r.randint(1, PAGE), r.randint(PAGE, 200)])
            self.stats["windowed"] += 1
        if r.random() < 0.3:
            kw["logits_soft_cap"] = r.choice([5.0, 30.0])
            self.stats["soft_capped"] += 1
        if r.random() < 0.3:
            kw["sinks"] = (torch.randn(self.hq, generator=self.gen) * 3).to(self.device)
            self.stats["sinks"] += 1
        return kw

    def stored(self, x, key):
        """What the cache holds after writing x ([layers, n, kv heads, head_dim],
        the step's keys (key) or values of n positions), as [n, layers, ...]:
        the elements, or a quantized cache's bytes (uint8) and per-vector
        scales ([n, layers, kv heads]; None per tensor), as cache_write
        quantizes (reference.quantize, keys divided by k_smooth first)."""
        c = self.cache
        x = x.transpose(0, 1)
        if not c.quantized:
            return x, None
        x = x.float()
        if key:
            x = x / c.k_smooth.cpu()
        per_tensor = (c.k_scales if key else c.v_scales).cpu() if c.scale == "tensor" else None
        qx, scales = R.quantize(x, c.dtype, None if per_tensor is None else per_tensor[0])
        return qx.view(torch.uint8), None if per_tensor is not None else scales

    def check_batch_invariant(self, q, kc, vc, md, plan, causal, exact, what, kw):
        """The step again with batch_invariant=True (within the bounds of
        float64), and one of its sequences alone: the same bits."""
        bt, sl, cu = md.block_tables, md.seq_lens, md.cu_seqlens_q
        tokens = sum(n for _, n, _ in plan)
        out = poison_(torch.empty_like(q))
        ops.attention(out, q, kc, vc, bt, sl, cu, md.max_q_len, SCALE, causal, batch_invariant=True, **kw)
        check_out(out[:tokens], exact[:tokens], self.dtype, f"{what}, batch_invariant", self.ulps)
        rest = out[tokens:]
        assert torch.all(rest == 0) or torch.all(torch.isnan(rest)), f"{what}: batch_invariant padding rows"
        i = self.rng.choice([j for j, (_, n, _) in enumerate(plan) if n > 0])
        n, b = plan[i][1], int(cu[i])
        alone = poison_(torch.empty_like(q[b:b + n]))
        one = torch.tensor([0, n], dtype=torch.int32, device=q.device)
        ops.attention(alone, q[b:b + n].contiguous(), kc, vc, bt[i:i + 1], sl[i:i + 1], one, n, SCALE, causal,
                      batch_invariant=True, **kw)
        assert torch.equal(bits(alone), bits(out[b:b + n])), \
            f"{what}: sequence {i} ({n} queries) alone differs from its rows in the batch-invariant step"
        self.stats["batch_invariant"] += 1

    # ------------------------------------------------------------------ invariants
    def check_invariants(self):
        c, w = self.cache, self.where()
        assert sorted(c.seqs) == sorted(self.seqs), f"{w}: live sequences {c.seqs} != {sorted(self.seqs)}"
        assert c.num_free_seqs == c.max_seqs - len(self.seqs), f"{w}: free slot count"
        owners = {}
        for s, q in self.seqs.items():
            assert c.seq_len(s) == q.length, f"{w}: sequence {s} length {c.seq_len(s)} != {q.length}"
            pages = c.pages(s)
            want = self.pages_for(max(q.length, q.reserved))
            assert len(pages) == want, f"{w}: sequence {s} holds {len(pages)} pages, needs {want}"
            assert len(set(pages)) == len(pages), f"{w}: sequence {s} holds a page twice: {pages}"
            for j, p in enumerate(pages):
                assert 0 <= p < c.num_pages, f"{w}: sequence {s} holds page {p} outside the pool"
                owners.setdefault(p, []).append((s, j))
        for p in range(c.num_pages):
            own = owners.get(p, [])
            assert c.refcount(p) == len(own), f"{w}: page {p} refcount {c.refcount(p)}, owners {own}"
            if len(own) > 1:  # shared by fork: the same full page of each, never written again
                assert len({j for _, j in own}) == 1, f"{w}: page {p} shared at different indices: {own}"
                for s, j in own:
                    q = self.seqs[s]
                    assert j < q.shared and (j + 1) * PAGE <= q.length, \
                        f"{w}: page {p} shared by {own} but it is not a full page forked from one to the other"
        assert c.num_free_pages == c.num_pages - len(owners), \
            f"{w}: {c.num_free_pages} free pages, {c.num_pages - len(owners)} owned by nobody (leak or double free)"
        tables, lens = c.block_tables.cpu(), c.seq_lens.cpu()
        width = c.max_pages_per_seq
        for slot in range(c.max_seqs):
            pages = c.pages(slot) if slot in self.seqs else []
            assert tables[slot].tolist() == pages + [0] * (width - len(pages)), f"{w}: block_tables row {slot}"
            assert int(lens[slot]) == (self.seqs[slot].length if slot in self.seqs else 0), f"{w}: seq_lens[{slot}]"
        # Cached k/v of every live sequence == what was written at its positions.
        if not self.seqs:
            return
        pos = [torch.arange(q.length) for q in self.seqs.values()]
        page = torch.cat([torch.tensor(c.pages(s), dtype=torch.long)[p // PAGE] for s, p in zip(self.seqs, pos)])
        slot = torch.cat(pos) % PAGE
        page, slot = page.to(self.device), slot.to(self.device)
        pools = [x.view(torch.uint8) if c.quantized else x for x in (c.k_pools, c.v_pools)]
        got = torch.stack([x[:, page, :, slot] for x in pools], 1).cpu()  # [N, 2, layers, ...]
        want = torch.cat([q.kv[:q.length] for q in self.seqs.values()])
        bad = (got != want).flatten(1).any(-1)
        if c.quantized and c.scale == "vector":  # and the scales, bit for bit
            got = torch.stack([x[:, page, :, slot] for x in (c.k_scales, c.v_scales)], 1).cpu()
            want = torch.cat([q.scales[:q.length] for q in self.seqs.values()])
            bad |= (got.view(torch.int32) != want.view(torch.int32)).flatten(1).any(-1)
        start = 0
        for s, q in self.seqs.items():
            wrong = bad[start:start + q.length]
            assert not wrong.any(), \
                f"{w}: sequence {s}'s cached k/v differ from what was written at positions " \
                f"{wrong.nonzero().flatten()[:8].tolist()} (pages {c.pages(s)})"
            start += q.length


# (dtype, query heads, KV heads, seed, steps, CacheSoak options): groups 4 and
# 3 (the decode path for <= 16 queries either way; 3 rows of a 16-row tile);
# the quantized caches, and the per-layer variants on a bf16 and an fp8 cache.
CACHE_CASES = [
    pytest.param(torch.float32, 8, 2, 1, 500, {}, id="fp32-8q2kv"),
    pytest.param(torch.bfloat16, 8, 2, 2, 500, {}, id="bf16-8q2kv"),
    pytest.param(torch.bfloat16, 12, 4, 3, 500, {}, id="bf16-12q4kv"),
    pytest.param(torch.float32, 16, 4, 4, 500, {}, id="fp32-16q4kv"),
    pytest.param(torch.bfloat16, 8, 2, 5, 500, dict(cache=torch.int8), id="int8-8q2kv"),
    pytest.param(torch.bfloat16, 12, 4, 6, 500, dict(cache=torch.float8_e4m3fn), id="fp8-vector-12q4kv"),
    pytest.param(torch.bfloat16, 8, 2, 7, 500, dict(variants=True), id="bf16-8q2kv-variants"),
    pytest.param(torch.bfloat16, 8, 2, 8, 500, dict(cache=torch.float8_e4m3fn, scale="tensor", variants=True),
                 id="fp8-tensor-8q2kv-variants"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,num_q_heads,num_kv_heads,seed,steps,options", CACHE_CASES)
def test_cache_soak(device, dtype, num_q_heads, num_kv_heads, seed, steps, options):
    if device == "cuda":
        need("cache_write", "attention", "prefill", "decode", "combine")
    soak = CacheSoak(device, dtype, num_q_heads, num_kv_heads, seed, **options)
    for _ in range(steps):
        soak.step()
    while soak.seqs:  # drain: every page comes back
        soak.free(next(iter(soak.seqs)), "drained")
        soak.check_invariants()
    c = soak.cache
    assert c.num_free_pages == c.num_pages and c.num_free_seqs == c.max_seqs
    assert all(c.refcount(p) == 0 for p in range(c.num_pages))
    # The schedule reached what it is meant to exercise (a change that silently
    # stops refusals, forks or mixed steps fails here).
    st = soak.stats
    for key in ("add", "fork", "finished", "preempted", "step_refused", "reserve_refused", "add_refused",
                "freed_at_length_limit", "mixed", "decode_verify_only", "padded", "verify",
                "route_prepare", "route_append", "route_reserve", "batch_invariant") + \
            (("windowed", "soft_capped", "sinks") if options.get("variants") else ()):
        assert st[key] > 0, f"seed {seed}: the schedule never did {key!r}: {dict(st)}"


def test_prepare_step_past_max_pages_per_seq_changes_nothing():
    """Regression (found by the soak): prepare_step checked only the free-page
    count before appending, so a sequence past max_pages_per_seq raised after
    the sequences before it had been extended (and their device rows left stale)."""
    c = PagedKVCache(1, 64, 1, 64, page_size=16, max_seqs=4, max_pages_per_seq=3)
    a, b = c.add(10), c.add(40)
    before = (c.pages(a), c.pages(b), c.num_free_pages, c.block_tables.clone(), c.seq_lens.clone())
    with pytest.raises(CacheFullError, match="max_pages_per_seq"):
        c.prepare_step([a, b], [20, 9])  # a fits (2 pages), b would need 4
    assert (c.pages(a), c.pages(b), c.num_free_pages) == before[:3]
    assert c.seq_len(a) == 10 and c.seq_len(b) == 40
    assert torch.equal(c.block_tables, before[3]) and torch.equal(c.seq_lens, before[4])


# ---------------------------------------------------------------------- runner soak
RUNNER_CFG = Qwen3Config(vocab_size=256, hidden_size=128, num_layers=2, num_heads=8, num_kv_heads=2, head_dim=64,
                         intermediate_size=256, max_position=512)
RUNNER_TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}  # of the logits' magnitude (test_model's bf16 bound)


def _close(a, b, dtype, what):
    assert torch.isfinite(a).all(), f"{what}: non-finite logits"
    err = float((a.float() - b.float()).abs().max() / b.float().abs().max())
    assert err < RUNNER_TOL[dtype], f"{what}: logits differ by {err:.3g} of their magnitude"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,seed,steps,kv", [
    pytest.param(torch.float32, 11, 200, {}, id="fp32"),
    pytest.param(torch.bfloat16, 12, 200, {}, id="bf16"),
    pytest.param(torch.bfloat16, 13, 200, dict(kv_dtype=torch.int8), id="bf16-int8-cache"),
    pytest.param(torch.bfloat16, 14, 200, dict(kv_dtype=torch.float8_e4m3fn, kv_scale="tensor"),
                 id="bf16-fp8-tensor-cache")])
@torch.no_grad()
def test_runner_soak(device, dtype, seed, steps, kv):
    """Every step: our model's logits against the reference model's. When a
    sequence finishes, the logits of its last committed token against one
    prefill of its whole committed history on a fresh runner (our ops): what was
    cached over chunks, decodes, graph replays and partly accepted verifies is
    what the history gives. Both runners share PagedRunner, so the second check
    is the one that sees a mistake in the runner's lengths or in accepting."""
    if device == "cuda":
        need("prefill", "decode", "combine", "attention_inputs")
    torch.manual_seed(seed)
    max_seqs, max_len = 4, 256
    ours_model = Qwen3Model(RUNNER_CFG).randomize_(seed).to(device=device, dtype=dtype).eval()
    ref_model = copy.deepcopy(ours_model).set_backend("reference")
    ours = PagedRunner(ours_model, max_seqs, max_len, PAGE, seed=seed, **kv)
    ref = PagedRunner(ref_model, max_seqs, max_len, PAGE, seed=seed, **kv)
    chunk_max = 48  # the schedule's longest prompt chunk (its verifies take at most 16)
    any_mix = ours.capture(token_budget=max_seqs * chunk_max, max_q_len=chunk_max)
    ours.capture_decode()
    r = random.Random(seed)
    vocab = RUNNER_CFG.vocab_size
    active = [None] * max_seqs   # per slot: (prompt length, target length) or None
    history = [[] for _ in range(max_seqs)]  # committed tokens per slot
    last = [None] * max_seqs     # our logits of each slot's last committed token
    stats = Counter()

    def check_history(i, what):
        fresh = PagedRunner(ours_model, 1, max_len, PAGE, seed=seed + 1, **kv)
        _close(last[i], fresh.step([history[i]])[0][-1], dtype, f"{what}: slot {i} against a prefill of its history")
        stats["history_checked"] += 1

    for step in range(steps):
        for i in range(max_seqs):
            if active[i] is not None and ours.lens[i] >= active[i][1]:
                check_history(i, f"seed {seed} step {step}")
                active[i] = None  # finished: the slot stays idle with its length until restarted
                stats["finished"] += 1
            if active[i] is None and r.random() < 0.3:
                prompt = r.randint(1, 150)
                active[i] = (prompt, min(max_len - 16, prompt + r.randint(1, 60)))
                ours.lens[i] = ref.lens[i] = 0
                history[i], last[i] = [], None
                stats["started"] += 1
        assert ours.lens == ref.lens == [len(h) for h in history]
        used = [i for i in range(max_seqs) if active[i] is not None]
        if not used:
            continue
        m = max(used) + 1
        causal = r.random() > 0.05  # non-causal: a drafting step, nothing committed
        tokens, accept = [], []
        for i in range(m):
            if active[i] is None or r.random() < 0.1:
                n = acc = 0  # idle: in the step with no query
            elif ours.lens[i] < active[i][0]:
                n = acc = min(active[i][0] - ours.lens[i], r.randint(1, chunk_max))
            elif r.random() < 0.3:
                n = r.randint(2, 16)
                acc = n if r.random() < 0.4 else r.randint(1, n - 1)
            else:
                n = acc = 1
            tokens.append([r.randrange(vocab) for _ in range(n)])
            accept.append(acc if causal else 0)
        if not any(tokens):
            continue  # nothing to run (a model call of 0 tokens is not a step)
        what = f"seed {seed} step {step} q_lens {[len(t) for t in tokens]} causal {causal}"
        kinds = [len(t) for t in tokens]
        mixed = any(n > 16 for n in kinds) and any(0 < n <= 16 for n in kinds)
        if causal and all(n == 1 for n in kinds) and r.random() < 0.5:
            la = list(ours.decode_graph([t[0] for t in tokens]).split(1))
            lb = ref.step(tokens)
            ours.lens[:m] = ref.lens[:m] = [x - 1 for x in ref.lens[:m]]  # committed below, as eager steps
            what += " (decode replay)"
            stats["replay_decode"] += 1
        elif causal and r.random() < 0.5:
            la = any_mix.replay(tokens, commit=False)
            lb = ref.step(tokens, commit=False)
            what += " (replay at the token budget)"
            stats["replay_mixed" if mixed else "replay_other"] += 1
        else:
            la = ours.step(tokens, causal=causal, commit=False)
            lb = ref.step(tokens, causal=causal, commit=False)
        for i, (a, b) in enumerate(zip(la, lb)):
            if a.numel():
                _close(a, b, dtype, f"{what} slot {i}")
        for i, acc in enumerate(accept):
            ours.lens[i] += acc
            ref.lens[i] += acc
            history[i] += tokens[i][:acc]
            if acc:
                last[i] = la[i][acc - 1]
        stats["mixed" if mixed else "other"] += 1
        stats["verify"] += sum(acc < len(t) for acc, t in zip(accept, tokens) if causal)
    for key in ("started", "finished", "history_checked", "mixed", "verify", "replay_mixed", "replay_other",
                "replay_decode"):
        assert stats[key] > 0, f"seed {seed}: the runner schedule never did {key!r}: {dict(stats)}"
