"""Shared helpers of the benchmarks: timing, ceilings, run metadata, results.

Every benchmark script follows the same pattern:

    args = common.parser("what it measures").parse_args()
    env = common.print_header("decode")              # GPU, driver, versions, commit, command
    ceil = common.measure_ceilings(quick=args.quick) # copy GB/s, bf16 GEMM TFLOP/s, this run
    t = common.bench(fn, input_sets)                 # median of many CUDA-event timed reps
    common.save("decode", dict(env=env, ceilings=ceil, rows=rows, ...), args)

`save` writes benchmarks/results/<name>.json and <name>.png (figures.py draws
the PNG from the JSON alone), overwriting the previous ones: the directory
holds one current result per benchmark, and git keeps the earlier ones.
benchmarks/report.py renders README's tables from the same JSON files.

Results JSON: {"name", "env": environment(), "ceilings": {"copy_gbps",
"gemm_tflops", ...}, "args", "rows": [...], ...}. Rows of the attention
benchmarks carry "case", "impl", "role" ("ours", "peer", or "dev" for internal
A/B rows that the README plot and tables leave out), "us", and "gbps" /
"pct_copy" or "tflops" / "pct_gemm".

Timing rules encoded here:
- CUDA events around each call, a warm-up first (module load, JIT, cuDNN plans,
  workspace allocation stay out of the numbers), the median of many repeats.
- Inputs that fit in the 60 MB L2 would be timed from the cache: pass several
  input sets (`sets_for` says how many) and `bench` rotates among them, or pass
  flush_l2=True to scrub the L2 between repeats (outside the timed region).
- graph=True captures a CUDA graph of several calls and times its replays: how
  a serving engine runs small decode launches, without per-launch CPU gaps.
- Without a GPU everything falls back to host timers, so the scripts can be
  smoke-tested on a CPU machine with tiny sizes (numbers are meaningless there).
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import importlib
import importlib.util
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"

__all__ = [
    "ROOT", "RESULTS_DIR", "Timing", "gpu_state", "parser", "environment", "git_state", "print_header", "bench",
    "sets_for", "l2_bytes", "measure_ceilings", "copy_bandwidth", "gemm_rate", "results_path",
    "save", "print_table", "attempt", "load_tileinfer", "load_reference", "has_cuda_kernel", "fmt",
]


# ----------------------------------------------------------------------------- CLI

def parser(description: str) -> argparse.ArgumentParser:
    """The flags every benchmark takes."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true",
                   help="trimmed grid and shorter timing (scripts/gpu_check.sh uses it)")
    p.add_argument("--out-dir", type=Path, default=RESULTS_DIR,
                   help=f"where <name>.json and <name>.png go, replacing earlier ones (default {RESULTS_DIR})")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--only", default="", help="run only cases whose label contains this")
    p.add_argument("--no-ceilings", action="store_true",
                   help="skip the copy / GEMM ceilings (ratios to them are then left out)")
    return p


# ----------------------------------------------------------------------------- environment

def _nvidia_smi(query: str) -> Optional[str]:
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None
    except Exception:  # no nvidia-smi (CPU machine) or it hung: the metadata just lacks it
        return None


def _driver_version() -> Optional[str]:
    """The NVIDIA driver version (e.g. 580.159.04), from nvidia-smi or the kernel module."""
    v = _nvidia_smi("driver_version")
    if v:
        return v
    try:
        with open("/proc/driver/nvidia/version") as f:
            m = re.search(r"Kernel Module\s+(\S+)", f.read())
        return m.group(1) if m else None
    except OSError:
        return None


def _git(*args: str) -> Optional[str]:
    try:
        r = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else None
    except Exception:  # no git on the machine: the caller falls back
        return None


def git_state() -> dict:
    """The checkout's commit and whether tracked files differ from it. Result
    files under benchmarks/results/ do not count, since a run rewrites them.
    GIT_COMMIT and GIT_DIRTY (0 or 1), when set, name them instead: a copy of
    the tree on a GPU machine may have no .git, or one that is not its commit."""
    if os.environ.get("GIT_COMMIT"):
        # Named by the caller: the tree here may be a copy whose .git (if any)
        # is not the commit it holds.
        dirty = os.environ.get("GIT_DIRTY")
        return {"commit": os.environ["GIT_COMMIT"], "dirty": None if dirty is None else dirty not in ("", "0")}
    commit = _git("rev-parse", "HEAD")
    if commit:
        status = _git("status", "--porcelain", "--untracked-files=no", "--", ".",
                      ":(exclude)benchmarks/results")
        return {"commit": commit, "dirty": None if status is None else bool(status)}
    return {"commit": None, "dirty": None}


def _command() -> str:
    """The command line that started this process, the interpreter by its name
    (python3, not the path a launcher resolved it to)."""
    argv = list(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    argv[0] = Path(argv[0]).name
    return shlex.join(argv)


def l2_bytes() -> int:
    """L2 size of the current GPU (60 MB on an H200); 0 without a GPU."""
    if not torch.cuda.is_available():
        return 0
    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size)


def environment() -> dict:
    """What a reader needs to trust, compare or repeat the numbers: the commit
    (and whether the tree was dirty), GPU, driver, torch / CUDA / cuDNN
    versions, date (UTC, ISO 8601), the exact command line, and the clocks as
    found. Every result JSON stores this as its "env"."""
    env = {
        **git_state(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": _command(),
        "gpu": None,
        "driver": _driver_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(),
        "host": platform.node(),
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        env.update(gpu=p.name, sm_count=p.multi_processor_count, l2_mb=p.L2_cache_size / 1e6,
                   memory_gib=round(p.total_memory / 2**30, 1), capability=f"{p.major}.{p.minor}")
        # Clocks are read, never set: the card is measured as it is found.
        env["clocks"] = _nvidia_smi("clocks.sm,clocks.mem,clocks.max.sm,power.limit")
    else:
        env.update(gpu="cpu (no CUDA device)", sm_count=0, l2_mb=0.0)
    return env


def print_header(name: str) -> dict:
    env = environment()
    commit = (env["commit"] or "unknown")[:12] + (" (dirty)" if env["dirty"] else "")
    print(f"== {name}  {env['date']}  {env['gpu']}"
          + (f" ({env['sm_count']} SMs, L2 {env['l2_mb']:.0f} MB)" if env.get("sm_count") else ""))
    print(f"   commit {commit}  driver {env['driver']}  torch {env['torch']}  cuda {env['cuda']}  "
          f"cudnn {env['cudnn']}  python {env['python']}")
    print(f"   command: {env['command']}")
    if env.get("clocks"):
        print(f"   nvidia-smi (sm clk, mem clk, max sm clk, power limit): {env['clocks']}")
    sys.stdout.flush()
    return env


# ----------------------------------------------------------------------------- timing

@dataclass
class Timing:
    """Per-call times of one measured function, in microseconds."""
    median_us: float
    p10_us: float
    p90_us: float
    min_us: float
    reps: int
    mode: str  # "events", "events+flush", "graph", "host" (no GPU)
    sets: int  # input sets rotated
    gpu: Optional[dict] = None  # the card's clock and power over the same work (gpu_state), when NVML answers

    @property
    def seconds(self) -> float:
        return self.median_us * 1e-6

    def as_dict(self) -> dict:
        return asdict(self)


@contextlib.contextmanager
def environment_variable(name: str, value: Optional[str]):
    """Sets (or, with None, leaves alone) an environment variable for the
    duration of the block, then restores it."""
    if value is None:
        yield
        return
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def sets_for(bytes_per_set: int, factor: float = 3.0, cap: int = 64) -> int:
    """How many input sets to rotate so that consecutive calls do not find their
    inputs in L2: enough that the sets together exceed `factor` x L2."""
    l2 = l2_bytes()
    if l2 == 0 or bytes_per_set <= 0:
        return 1
    return int(max(1, min(cap, math.ceil(factor * l2 / bytes_per_set))))


_flush_buf: Optional[torch.Tensor] = None


def _flush_l2() -> None:
    global _flush_buf
    if _flush_buf is None:
        # Writing 4x the L2 leaves none of the previous call's lines in it.
        _flush_buf = torch.empty(max(4 * l2_bytes(), 1 << 20), dtype=torch.uint8, device="cuda")
    _flush_buf.zero_()


def _stats(times_us: Sequence[float], mode: str, sets: int) -> Timing:
    s = sorted(times_us)
    q = lambda f: s[min(len(s) - 1, max(0, int(round(f * (len(s) - 1)))))]  # noqa: E731
    return Timing(median_us=statistics.median(s), p10_us=q(0.1), p90_us=q(0.9), min_us=s[0],
                  reps=len(s), mode=mode, sets=sets)


def _cycle(fn: Callable, sets: Sequence[tuple]):
    i = 0

    def call():
        nonlocal i
        fn(*sets[i % len(sets)])
        i += 1
    return call


class _Nvml:
    """The card's SM clock, power draw and clock-event reasons through NVML
    (the driver's libnvidia-ml, through ctypes: no Python package needed).
    One instance per process; get() returns None where NVML does not answer."""
    SM_CLOCK = 1           # NVML_CLOCK_SM
    POWER_CAP = 0x4        # clock-event reason: software power cap
    SLOWDOWN = 0x8 | 0x20 | 0x40 | 0x80  # hardware slowdown, software / hardware thermal, power brake
    _inst = None

    @classmethod
    def get(cls) -> Optional["_Nvml"]:
        if cls._inst is None:
            try:
                cls._inst = cls()
            except Exception:  # no driver library (CPU machine), or an older driver without these calls
                cls._inst = False
        return cls._inst or None

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit failed")
        self.handle = ctypes.c_void_p()
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
            bus = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0".encode()
            rc = self.lib.nvmlDeviceGetHandleByPciBusId_v2(ctypes.c_char_p(bus), ctypes.byref(self.handle))
        else:  # the CUDA index, which is NVML's without CUDA_VISIBLE_DEVICES
            rc = self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(torch.cuda.current_device()),
                                                        ctypes.byref(self.handle))
        if rc != 0:
            raise RuntimeError("no NVML handle for the device")
        # (renamed from ...ThrottleReasons in newer drivers, which keep the old name too)
        self.reasons = (getattr(self.lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
                        or self.lib.nvmlDeviceGetCurrentClocksThrottleReasons)
        self.sample()  # raises here, once, if a call is missing

    def sample(self) -> tuple[int, float, int]:
        """(SM clock in MHz, power in W, clock-event reason bits)."""
        clk, mw, why = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        if (self.lib.nvmlDeviceGetClockInfo(self.handle, self.SM_CLOCK, ctypes.byref(clk))
                or self.lib.nvmlDeviceGetPowerUsage(self.handle, ctypes.byref(mw))
                or self.reasons(self.handle, ctypes.byref(why))):
            raise RuntimeError("NVML query failed")
        return clk.value, mw.value / 1e3, why.value


def gpu_state(run_once: Callable[[], None], call_ms: float, ms: float = 50.0) -> Optional[dict]:
    """Runs run_once() for about `ms` of GPU time after the timing (never
    during it: the samples take the host), reading the card's SM clock, power
    and clock-event reasons between calls and until the stream drains.
    Returns their medians and the share of samples under the power cap or a
    thermal / hardware slowdown, or None where NVML does not answer. A
    compute-bound kernel that runs below the card's top clock with the power
    cap set is held by the power limit: idle cycles cost it nothing there."""
    nv = _Nvml.get()
    if nv is None or not torch.cuda.is_available():
        return None
    try:
        calls = max(1, math.ceil(ms / max(call_ms, 1e-3)))
        every = max(1, int(1.0 / max(call_ms, 1e-3)))  # about one sample per ms of GPU work
        deadline = time.perf_counter() + 2 * ms / 1e3  # calls shorter than their launch: the host's pace
        samples = []
        for i in range(calls):
            run_once()
            if i % every == every - 1:
                samples.append(nv.sample())
            if time.perf_counter() > deadline:
                break
        stream = torch.cuda.current_stream()
        while not stream.query():
            samples.append(nv.sample())
            time.sleep(0.0005)
        torch.cuda.synchronize()
    except Exception:
        return None
    if not samples:
        return None
    n = len(samples)
    return {"sm_mhz": statistics.median(s[0] for s in samples), "power_w": statistics.median(s[1] for s in samples),
            "power_capped": sum(1 for s in samples if s[2] & _Nvml.POWER_CAP) / n,
            "slowdown": sum(1 for s in samples if s[2] & _Nvml.SLOWDOWN) / n, "samples": n}


def bench(
    fn: Callable,
    input_sets: Optional[Sequence[tuple]] = None,
    *,
    warmup_ms: float = 25.0,
    rep_ms: float = 200.0,
    min_reps: int = 10,
    max_reps: int = 1000,
    flush_l2: bool = False,
    graph: bool = False,
    graph_min_us: float = 500.0,
    max_graph_calls: int = 128,
) -> Timing:
    """Median time of one call fn(*input_sets[i]) over many repeats, rotating
    through the input sets (default: one empty set, fn()).

    events (default): a CUDA event pair around every call; back-to-back
      launches, so a call shorter than its launch cost measures the launch rate.
    flush_l2: scrub the L2 before each call (outside the events).
    graph: capture ceil(graph_min_us / t) calls (a multiple of the number of
      sets, at most max_graph_calls) into one CUDA graph and time replays; the
      per-call time is replay time / calls. fn must be capturable (no host
      syncs, no allocation that differs between calls)."""
    sets = list(input_sets) if input_sets else [()]
    if not torch.cuda.is_available():
        return _bench_host(fn, sets, warmup_ms, rep_ms, min_reps, max_reps)
    if graph and flush_l2:
        raise ValueError("bench: graph replay cannot flush L2 between calls; rotate input sets instead")
    call = _cycle(fn, sets)

    # Warm-up, and a first estimate of one call's time to size the repeats.
    call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n_est = max(len(sets), 3)
    start.record()
    for _ in range(n_est):
        call()
    end.record()
    end.synchronize()
    est_ms = max(start.elapsed_time(end) / n_est, 1e-4)
    for _ in range(int(min(max_reps, warmup_ms / est_ms))):
        call()
    torch.cuda.synchronize()

    if graph:
        return _bench_graph(fn, sets, est_ms, rep_ms, min_reps, max_reps, graph_min_us, max_graph_calls)

    reps = int(max(min_reps, min(max_reps, rep_ms / est_ms)))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in events:
        if flush_l2:
            _flush_l2()
        s.record()
        call()
        e.record()
    torch.cuda.synchronize()
    t = _stats([s.elapsed_time(e) * 1e3 for s, e in events], "events+flush" if flush_l2 else "events", len(sets))
    t.gpu = gpu_state(call, t.median_us / 1e3)
    return t


def _bench_graph(fn, sets, est_ms, rep_ms, min_reps, max_reps, graph_min_us, max_graph_calls) -> Timing:
    n = len(sets)
    calls = max(1, math.ceil(graph_min_us / (est_ms * 1e3)))
    calls = min(max(calls, n), max(max_graph_calls, n))
    calls = n * math.ceil(calls / n)
    # torch.cuda.graph captures on a side stream; warm that stream up first
    # (libraries allocate workspaces and pick plans on their first call).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(n):
            fn(*sets[i])
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(*sets[i % n])
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    replay_ms = est_ms * calls
    reps = int(max(min_reps, min(max_reps, rep_ms / replay_ms)))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in events:
        s.record()
        g.replay()
        e.record()
    torch.cuda.synchronize()
    t = _stats([s.elapsed_time(e) * 1e3 / calls for s, e in events], "graph", n)
    t.gpu = gpu_state(g.replay, t.median_us * calls / 1e3)
    del g
    return t


def _bench_host(fn, sets, warmup_ms, rep_ms, min_reps, max_reps) -> Timing:
    call = _cycle(fn, sets)
    call()
    t0 = time.perf_counter()
    call()
    est_ms = max((time.perf_counter() - t0) * 1e3, 1e-3)
    reps = int(max(min_reps, min(max_reps, rep_ms / est_ms)))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e6)
    return _stats(times, "host", len(sets))


def require_cuda_ops(script: str) -> None:
    """Exits with the reason where a CUDA device or our extension is missing
    (for the profile_*.py scripts, which measure nothing without them)."""
    if not torch.cuda.is_available():
        sys.exit(f"{script}: needs a CUDA device")
    loaded, why = load_tileinfer()
    if loaded is None:
        sys.exit(f"{script}: {why}")


def profiled_calls(fn: Callable, args: tuple, calls: int, label: str) -> Optional[float]:
    """One warm-up call of fn(*args), then `calls` more timed back to back with
    CUDA events (no graph, no rotation of inputs): prints and returns us a
    call (`label` names the line), or None for calls <= 0. For scripts a
    profiler watches (profile_*.py), whose figures match the benchmarks' only
    roughly."""
    fn(*args)  # warm-up (and the first call's one-time work)
    if calls <= 0:
        return None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn(*args)
    end.record()
    torch.cuda.synchronize()
    us = start.elapsed_time(end) * 1e3 / calls
    print(f"{label}: {us:.1f} us a call ({calls} calls)", flush=True)
    return us


def attempt(label: str, thunk: Callable, errors: Optional[list] = None):
    """Runs thunk(); on an exception prints one line naming `label` and returns
    None, so one failing peer or case never stops a benchmark run."""
    try:
        return thunk()
    except Exception as e:  # noqa: BLE001 -- any failure of a peer is reported, not fatal
        msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        print(f"   [skip] {label}: {msg}")
        if os.environ.get("TILEINFER_BENCH_TRACEBACK"):
            traceback.print_exc()
        if errors is not None:
            errors.append({"label": label, "error": msg})
        if torch.cuda.is_available():
            try:
                torch.cuda.synchronize()
            except Exception as e2:  # noqa: BLE001 -- a sticky error (illegal address): say so once
                print(f"   [skip] CUDA context unusable after {label}: {type(e2).__name__}: {e2}"[:300])
        return None


# ----------------------------------------------------------------------------- ceilings

def copy_bandwidth(nbytes: int = 2 << 30, quick: bool = False) -> dict:
    """Device-to-device copy of a few-GB buffer, counting bytes read + written."""
    if not torch.cuda.is_available():
        return {"copy_gbps": None}
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 256)
    dst = torch.empty_like(src)
    t = bench(lambda: dst.copy_(src), warmup_ms=20, rep_ms=50 if quick else 200, min_reps=10)
    src = dst = None  # noqa: F841 -- frees the buffers before the next measurement
    torch.cuda.empty_cache()
    return {"copy_gbps": 2 * nbytes / t.seconds / 1e9, "copy_bytes": 2 * nbytes, "copy_us": t.median_us,
            "copy_spread_us": [t.p10_us, t.p90_us]}


def gemm_rate(n: int = 8192, quick: bool = False) -> dict:
    """bf16 n x n x n matrix product on random data (zeros draw less power and run faster)."""
    if not torch.cuda.is_available():
        return {"gemm_tflops": None}
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    t = bench(lambda: torch.mm(a, b, out=c), warmup_ms=50, rep_ms=50 if quick else 200, min_reps=10)
    a = b = c = None  # noqa: F841
    torch.cuda.empty_cache()
    return {"gemm_tflops": 2 * n**3 / t.seconds / 1e12, "gemm_n": n, "gemm_us": t.median_us,
            "gemm_spread_us": [t.p10_us, t.p90_us]}


def measure_ceilings(quick: bool = False, skip: bool = False) -> dict:
    """Both ceilings, measured in this run, printed on one line."""
    if skip or not torch.cuda.is_available():
        return {"copy_gbps": None, "gemm_tflops": None}
    c = {**copy_bandwidth(quick=quick), **gemm_rate(quick=quick)}
    print(f"   ceilings this run: copy {c['copy_gbps']:.0f} GB/s (read+write, {c['copy_bytes'] / 1e9:.1f} GB), "
          f"bf16 GEMM {c['gemm_tflops']:.0f} TFLOP/s ({c['gemm_n']}^3, random data)")
    sys.stdout.flush()
    return c


# ----------------------------------------------------------------------------- our ops

_tileinfer_status: Optional[tuple] = None


def load_tileinfer():
    """(module, None) when the extension imports, else (None, reason). Benchmarks
    still time peers and ceilings when our build is missing or broken."""
    global _tileinfer_status
    if _tileinfer_status is None:
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        try:
            _tileinfer_status = (importlib.import_module("tileinfer_attn"), None)
        except Exception as e:  # noqa: BLE001 -- a missing .so is a reason to skip, not to stop
            _tileinfer_status = (None, f"import tileinfer_attn failed: {type(e).__name__}: {e}"[:300])
    return _tileinfer_status


def has_cuda_kernel(op: str) -> tuple[bool, str]:
    """Whether torch.ops.tileinfer_attn.<op> has a CUDA kernel in this build, and why not."""
    mod, why = load_tileinfer()
    if mod is None:
        return False, why
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    if not hasattr(torch.ops.tileinfer_attn, op):
        return False, f"tileinfer_attn::{op} is not registered"
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"tileinfer_attn::{op}", "CUDA"):
        return False, f"tileinfer_attn::{op} has no CUDA kernel in this build"
    return True, ""


def load_reference():
    """tileinfer_attn.reference, loaded from its file when the package itself
    cannot import (no built extension): the eager peer needs no kernels."""
    mod, _ = load_tileinfer()
    if mod is not None:
        return importlib.import_module("tileinfer_attn.reference")
    module_spec = importlib.util.spec_from_file_location("_tileinfer_reference", ROOT / "tileinfer_attn" / "reference.py")
    ref = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(ref)
    return ref


# ----------------------------------------------------------------------------- results

def results_path(name: str, ext: str, out_dir: Optional[Path] = None) -> Path:
    """benchmarks/results/<name>.<ext> (or under out_dir): one current file per benchmark."""
    d = Path(out_dir) if out_dir else RESULTS_DIR
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{name}.{ext}"


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, Timing):
        return x.as_dict()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if isinstance(x, (torch.dtype, Path)):
        return str(x)
    return repr(x)


def save(name: str, payload: dict, args: argparse.Namespace) -> Path:
    """Writes <out_dir>/<name>.json (payload plus "name" and "args"; payload
    holds "env" and "ceilings" of this run and the "rows") and, unless
    --no-plot, <name>.png drawn from that JSON by figures.py."""
    data = _jsonable({"name": name, **payload, "args": vars(args)})
    path = results_path(name, "json", args.out_dir)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print(f"   wrote {path}")
    if not args.no_plot:
        import figures
        png = figures.plot(data, results_path(name, "png", args.out_dir))
        if png:
            print(f"   wrote {png}")
    return path


def fmt(x, fmt_spec: str = ".1f", none: str = "-") -> str:
    return none if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt_spec)


def print_table(rows: Iterable[dict], columns: Sequence[tuple], title: str = "") -> None:
    """Plain-text table; columns are (header, key, format string)."""
    rows = list(rows)
    cells = [[h for h, _, _ in columns]]
    for r in rows:
        cells.append([fmt(r.get(k), fmt_spec) if fmt_spec else str(r.get(k, "-")) for _, k, fmt_spec in columns])
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    if title:
        print(title)
    for n, row in enumerate(cells):
        # Text columns (no format string) left-aligned, numbers right-aligned.
        print("  " + "  ".join(c.ljust(w) if not n or not columns[i][2] else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        if n == 0:
            print("  " + "  ".join("-" * w for w in widths))
    sys.stdout.flush()
