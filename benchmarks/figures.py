"""The PNG of each benchmark, drawn from its result JSON alone (no torch), so a
figure always shows exactly what the JSON holds.

Each figure answers "how close to the ceiling" and "how far ahead of the best
peer": a linear axis, bars as a fraction of the ceiling measured in the same
run (copy bandwidth or bf16 GEMM rate) or as a time ratio to a peer with the
1.0 line drawn, one panel per question, the legend outside the bars, and the
GPU / date / commit in the title. Rows whose role is "dev" (internal A/B
variants of our own kernels) stay out of these figures.

    python3 benchmarks/figures.py benchmarks/results/decode.json [...]   # redraws <name>.png
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional, Sequence

SHOWN = ("ours", "peer")


def title(what: str, data: dict) -> str:
    env = data.get("env") or {}
    commit = (env.get("commit") or "unknown")[:10] + (" + uncommitted changes" if env.get("dirty") else "")
    return f"{what}\n{env.get('gpu', '?')}, {str(env.get('date', '?'))[:10]}, commit {commit}"


def _draw(path: Path, heading: str, groups: Sequence[str], panels: Sequence[dict]) -> Optional[Path]:
    """One figure of grouped bars, one panel per dict: series {label: values
    per group (None: not measured)}, ylabel, and optional line (value, label)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001 -- no matplotlib: the JSON is the result, the PNG optional
        print(f"   [skip] plot {Path(path).name}: matplotlib unavailable ({e})")
        return None
    panels = [p for p in panels if any(v is not None for vs in p["series"].values() for v in vs)]
    if not groups or not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, squeeze=False,
                             figsize=(max(7.0, 0.35 * len(groups) * max(len(p["series"]) for p in panels) + 3),
                                      3.4 * len(panels) + 0.8))
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        names = [k for k, v in panel["series"].items() if any(x is not None for x in v)]
        width = 0.8 / max(1, len(names))
        for i, name in enumerate(names):
            xs = [g + (i - (len(names) - 1) / 2) * width for g in range(len(groups))]
            ys = [float("nan") if v is None else v for v in panel["series"][name]]
            bars = ax.bar(xs, ys, width, label=name, color=f"C{i}")
            if len(names) == 1:  # a ratio panel: its values written on the bars
                ax.bar_label(bars, fmt="%.2f", fontsize=7)
        if panel.get("line"):
            value, label = panel["line"]
            ax.axhline(value, color="black", linestyle="--", linewidth=1, label=label)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(groups, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(panel["ylabel"], fontsize=8)
        ax.set_ylim(bottom=0)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    axes[0, 0].set_title(heading, fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _cases(rows) -> list:
    return list(dict.fromkeys(r["case"] for r in rows))


def _row(rows, case, impl):
    return next((r for r in rows if r.get("case") == case and r.get("impl") == impl), None)


def _impls(rows, roles=SHOWN) -> list:
    return list(dict.fromkeys(r["impl"] for r in rows if r.get("role", "peer") in roles))


def best_peer(rows, case) -> Optional[dict]:
    """The fastest peer row of a case."""
    peers = [r for r in rows if r.get("case") == case and r.get("role", "peer") == "peer" and r.get("us")]
    return min(peers, key=lambda r: r["us"]) if peers else None


def ours(rows, case) -> Optional[dict]:
    return next((r for r in rows if r.get("case") == case and r.get("role") == "ours"), None)


def _ceiling_panel(rows, cases, key: str, ceiling: Optional[float], what: str, unit: str) -> dict:
    """Each shown impl's rate as a fraction of the ceiling of this run (the
    absolute rate where the run measured no ceiling)."""
    scale = 1.0 / ceiling if ceiling else 1.0
    series = {i: [(r[key] * scale if (r := _row(rows, c, i)) and r.get(key) is not None else None) for c in cases]
              for i in _impls(rows)}
    if ceiling:
        return dict(series=series, ylabel=f"fraction of {what}\n({ceiling:.0f} {unit}, this run)",
                    line=(1.0, what))
    return dict(series=series, ylabel=unit)


def _peer_panel(rows, cases) -> dict:
    """Our time advantage over the fastest peer of each case: t_peer / t_ours."""
    vals = []
    for c in cases:
        o, p = ours(rows, c), best_peer(rows, c)
        vals.append(p["us"] / o["us"] if o and p and o.get("us") else None)
    return dict(series={"ours vs the fastest peer": vals}, ylabel="t_best_peer / t_ours\n(> 1: ours faster)",
                line=(1.0, "as fast as the fastest peer"))


def plot_prefill(data: dict, path: Path):
    rows = data.get("rows") or []
    cases = _cases(rows)
    gemm = (data.get("ceilings") or {}).get("gemm_tflops")
    return _draw(path, title("Causal prefill, paged KV cache (bf16, page 64)", data), cases,
                 [_ceiling_panel(rows, cases, "tflops", gemm, "bf16 GEMM rate", "TFLOP/s"), _peer_panel(rows, cases)])


def plot_decode(data: dict, path: Path):
    rows = data.get("rows") or []
    cases = _cases(rows)
    copy = (data.get("ceilings") or {}).get("copy_gbps")
    return _draw(path, title("Decode (one query per sequence), paged KV cache (bf16, page 64)", data), cases,
                 [_ceiling_panel(rows, cases, "gbps", copy, "copy bandwidth", "GB/s"), _peer_panel(rows, cases)])


def plot_int8(data: dict, path: Path):
    rows = [r for r in data.get("rows") or [] if r.get("role") != "dev"]
    cases = _cases(rows)
    copy = (data.get("ceilings") or {}).get("copy_gbps")
    bf16 = "tileinfer bf16 (attention op)"
    quant = {"int8": "tileinfer int8 (attention op)", "fp8 per tensor": "tileinfer fp8 per tensor (attention op)",
             "fp8 per vector": "tileinfer fp8 per vector (attention op)"}

    def speedup(name):
        t = {(r["case"], r["impl"]): r["us"] for r in rows}
        return [t[c, bf16] / t[c, name] if (c, bf16) in t and (c, name) in t else None for c in cases]
    # Every cache is ours: the question is each quantized cache's gain over bf16, not a peer.
    first = _ceiling_panel([dict(r, role="ours") for r in rows], cases, "gbps", copy, "copy bandwidth", "GB/s")
    first["ylabel"] = first["ylabel"].replace("fraction of", "bytes each cache must read,\nfraction of")
    series = {label: speedup(name) for label, name in quant.items() if any(r["impl"] == name for r in rows)}
    return _draw(path, title("Decode on quantized vs bf16 paged KV caches (our attention op)", data), cases,
                 [first, dict(series=series, ylabel="t_bf16 / t\n(> 1: faster than bf16)",
                               line=(1.0, "as fast as bf16"))])


INPUTS_SERIES = (("fused", "attention_inputs (fused, 2 launches)"), ("copy", "copies of as many bytes (2 launches)"),
                 ("unfused", "separate ops (5 launches)"), ("eager", "eager PyTorch"))


def plot_inputs(data: dict, path: Path):
    rows = data.get("rows") or []
    cases = [r["case"] for r in rows]
    copy = (data.get("ceilings") or {}).get("copy_gbps")
    scale = 1.0 / copy if copy else 1.0
    first = dict(series={label: [r[f"{k}_gbps"] * scale if r.get(f"{k}_gbps") else None for r in rows]
                         for k, label in INPUTS_SERIES},
                 ylabel=(f"fraction of copy bandwidth\n({copy:.0f} GB/s, this run)" if copy else "GB/s"),
                 line=(1.0, "copy bandwidth") if copy else None)
    best = []  # the fastest peer that does the same work: separate ops or eager PyTorch
    for r in rows:
        peers = [r[f"{k}_us"] for k in ("unfused", "eager") if r.get(f"{k}_us")]
        best.append(min(peers) / r["fused_us"] if peers and r.get("fused_us") else None)
    second = dict(series={"fused vs the fastest peer (separate ops or eager)": best},
                  ylabel="t_best_peer / t_fused\n(> 1: fused faster)", line=(1.0, "as fast as the fastest peer"))
    return _draw(path, title("Attention inputs (norms + RoPE + cache write), CUDA-graph replays", data), cases,
                 [first, second])


def plot_model(data: dict, path: Path):
    rows = data.get("rows") or []
    layers = data.get("layers") or (data.get("args") or {}).get("layers", "?")
    return _draw(path, title(f"Decode step of {layers} Qwen3-4B layers, CUDA graphs", data),
                 [r["label"] for r in rows],
                 [dict(series={"ours (paged) vs SDPA cuDNN (contiguous)": [r.get("speedup") for r in rows]},
                       ylabel="t_sdpa / t_ours\n(> 1: ours faster)", line=(1.0, "as fast as SDPA"))])


PLOTS = {"prefill": plot_prefill, "decode": plot_decode, "int8": plot_int8, "inputs": plot_inputs,
         "model": plot_model}


def plot(data: dict, path: Path) -> Optional[Path]:
    """The figure of one result JSON (dispatching on its "name")."""
    fn = PLOTS.get(data.get("name"))
    return fn(data, Path(path)) if fn else None


def main(argv: Sequence[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for name in argv:
        src = Path(name)
        with open(src) as f:
            png = plot(json.load(f), src.with_suffix(".png"))
        print(f"wrote {png}" if png else f"{src}: nothing to plot")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
