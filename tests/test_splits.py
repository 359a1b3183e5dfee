"""The decode split rule (tileinfer/decode_splits.h, the op decode_num_splits):
about two blocks per SM over the (sequence, KV head) pairs, rounded down, at
most 32 splits (256 / pairs, at most 128, for fewer than 8 pairs), never fewer than 1, whatever the step's query count or cache
type (the op takes only the SM count and the pairs); the CPU path counts 8
"SMs" and two blocks each. And how a batch-invariant plan's blocks share a
pair's splits in runs (split_run)."""
import subprocess

import pytest
import torch

import tileinfer_attn as ti
from cpp_tool import compile_tool

split = torch.ops.tileinfer_attn.decode_num_splits


@pytest.mark.parametrize("args,expected", [
    # (num_sms, num_seqs, num_kv_heads)
    ((132, 8, 8), 4),     # 264 slots / 64 (sequence, head) pairs
    ((132, 1, 8), 32),    # one sequence: capped at 32
    ((132, 32, 8), 1),    # more pairs than slots: one split
    ((132, 1, 1), 128),   # one sequence of an MQA model: 256 / 1 pairs, capped at 128
    ((132, 1, 2), 128),   # 256 / 2 pairs
    ((132, 2, 2), 64),    # 256 / 4 pairs (264 / 4 = 66 slots' worth)
    ((132, 1, 4), 64),
    ((0, 1, 2), 8),       # CPU: 8 "SMs", two blocks each
])
def test_decode_num_splits(args, expected):
    assert split(*args) == expected


def test_wrapper_counts_the_devices_sms():
    """ti.decode_num_splits(device, ...) is the op with the device's SM count (0 on the CPU)."""
    assert ti.decode_num_splits("cpu", 1, 2) == split(0, 1, 2) == 8
    if torch.cuda.is_available():
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        assert ti.decode_num_splits("cuda", 8, 8) == split(sms, 8, 8)


def test_split_runs_cover_every_split_once(tmp_path_factory):
    """Batch-invariant decode's runs of splits (decode_splits.h, split_run):
    for every count of splits with keys, of split slots (up to 32) and of
    blocks a pair, each split with keys is walked by exactly one block, in a
    run of consecutive splits, and each empty split gets its lse from exactly
    one block (tests/split_runs.cpp)."""
    tool = compile_tool(tmp_path_factory, "split_runs.cpp")
    result = subprocess.run([str(tool)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr
