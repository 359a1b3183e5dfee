"""End-to-end decode step of a Qwen3-style model: our paged attention vs SDPA on a
contiguous cache, same weights, both captured in CUDA graphs.

Shapes: Qwen3-4B layers (hidden 2560, 32 q / 8 kv heads, head dim 128, MLP
9728), only --layers of them (default 4) so the weights stay small; the step
time scales with layers, tokens/s is reported for these layers. Both models
start from caches filled with random keys/values at the given context length.

Our model: attention_inputs (q/k RMSNorm + RoPE + paged cache write) + attention.
Peer: the same norms and RoPE in eager PyTorch, index_copy_ into a contiguous
[B, kv_heads, max_len, d] cache, torch SDPA (cuDNN backend, GQA) over it.

Writes benchmarks/results/model.json and model.png.

    python3 benchmarks/bench_model.py [--quick] [--layers 4] [--only B1x] [--out-dir DIR]
"""
from __future__ import annotations

import torch
from torch import nn

import common

# The package's modules, imported by main() once the extension is known to load
# (so that --help and a run without a build still work).
reference = AttentionMetadata = Qwen3Config = Qwen3Model = None

CASES = [(1, 4096), (8, 4096), (32, 2048), (64, 1024), (1, 32768)]
QUICK = [(1, 4096), (32, 2048), (1, 32768)]
PAGE = 64
NAME = "model"


class ContiguousSDPA(nn.Module):
    """The peer's attention: eager norms/RoPE, contiguous cache, SDPA (decode: 1 token per sequence)."""

    def __init__(self, attn, batch: int, max_len: int, pos: torch.Tensor):
        super().__init__()
        self.attn, self.pos = attn, pos  # pos: [1] int64 device tensor, this step's position
        p = attn.q_norm
        shape = (batch, attn.num_kv_heads, max_len, attn.head_dim)
        self.k = torch.randn(shape, dtype=p.dtype, device=p.device)
        self.v = torch.randn(shape, dtype=p.dtype, device=p.device)

    def forward(self, q, k, v, kv_cache, metadata):
        a, b = self.attn, q.shape[0]
        q = reference.rms_norm(q.view(b, a.num_heads, a.head_dim), a.q_norm, a.eps)
        k = reference.rms_norm(k.view(b, a.num_kv_heads, a.head_dim), a.k_norm, a.eps)
        positions = self.pos.expand(b)
        q = reference.rope(q, positions, a.cos_sin_cache, a.rotary_dim)
        k = reference.rope(k, positions, a.cos_sin_cache, a.rotary_dim)
        self.k.index_copy_(2, self.pos, k.unsqueeze(2))
        self.v.index_copy_(2, self.pos, v.view(b, a.num_kv_heads, 1, a.head_dim))
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            o = torch.nn.functional.scaled_dot_product_attention(
                q.unsqueeze(2), self.k, self.v, scale=a.scale, enable_gqa=True)
        return o.reshape(b, -1)


def graph_of(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


@torch.no_grad()
def run_case(cfg, weights, batch, ctx):
    dev = "cuda"
    ours = Qwen3Model(cfg).to(device=dev, dtype=torch.bfloat16).eval()
    ours.load_state_dict(weights)
    pages = -(-(ctx + 1) // PAGE)
    kv = ours.new_kv_caches(batch * pages + 1, PAGE)
    for k_cache, v_cache in kv:
        k_cache.normal_()
        v_cache.normal_()
    tables = torch.randperm(batch * pages, device=dev).int().view(batch, pages)
    meta = AttentionMetadata.build(tables, [ctx + 1] * batch, [1] * batch, dev)
    ids = torch.randint(0, cfg.vocab_size, (batch,), device=dev)
    t_ours = common.bench(graph_of(lambda: ours(ids, kv, meta)).replay)

    peer = Qwen3Model(cfg).to(device=dev, dtype=torch.bfloat16).eval()
    peer.load_state_dict(weights)
    pos = torch.tensor([ctx], device=dev)
    # Peer caches: [:ctx] random history, position ctx written by the step; SDPA reads ctx+1 positions.
    for layer in peer.layers:
        layer.attn = ContiguousSDPA(layer.attn, batch, ctx + 1, pos)
    t_peer = common.bench(graph_of(lambda: peer(ids, [None] * cfg.num_layers, meta)).replay)
    del ours, peer, kv
    torch.cuda.empty_cache()
    return dict(label=f"B{batch}x{ctx}", batch=batch, ctx=ctx, ours_us=t_ours.median_us,
                sdpa_us=t_peer.median_us, ours_tok_s=batch / (t_ours.median_us * 1e-6),
                sdpa_tok_s=batch / (t_peer.median_us * 1e-6), speedup=t_peer.median_us / t_ours.median_us)


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    args = p.parse_args()
    env = common.print_header(NAME)
    ok, why = common.has_cuda_kernel("attention_inputs")
    if not torch.cuda.is_available() or not ok:
        print(f"   [skip] {NAME}: {why if torch.cuda.is_available() else 'no CUDA device'}")
        return
    global reference, AttentionMetadata, Qwen3Config, Qwen3Model
    from tileinfer_attn import reference
    from tileinfer_attn.metadata import AttentionMetadata
    from tileinfer_attn.models.qwen3 import Qwen3Config, Qwen3Model
    ceil = common.measure_ceilings(quick=args.quick, skip=args.no_ceilings)
    cfg = Qwen3Config(vocab_size=32768, hidden_size=2560, num_layers=args.layers, num_heads=32, num_kv_heads=8,
                      head_dim=128, intermediate_size=9728, max_position=40960)
    weights = Qwen3Model(cfg).randomize_(0).to(dtype=torch.bfloat16).state_dict()
    rows, errors = [], []
    for batch, ctx in (QUICK if args.quick else CASES):
        label = f"B{batch}x{ctx}"
        if args.only and args.only not in label:
            continue
        row = common.attempt(label, lambda: run_case(cfg, weights, batch, ctx), errors)
        if row:
            rows.append(row)
    common.print_table(rows, [("case", "label", ""), ("ours us", "ours_us", ".1f"), ("sdpa us", "sdpa_us", ".1f"),
                              ("ours tok/s", "ours_tok_s", ".0f"), ("sdpa tok/s", "sdpa_tok_s", ".0f"),
                              ("speedup", "speedup", ".2f")],
                       title=f"decode step, {args.layers} Qwen3-4B layers, CUDA graphs")
    common.save(NAME, dict(env=env, ceilings=ceil, layers=args.layers, rows=rows, errors=errors), args)


if __name__ == "__main__":
    main()
