"""The decode split rule (tileinfer/decode_splits.h, the op decode_num_splits): about two
blocks per SM, rounded down, at most 32 splits (whatever the step's query
count or cache type), never fewer than 1; the CPU path counts 8 "SMs" and two
blocks each."""
import pytest
import torch

import tileinfer_attn  # noqa: F401  (registers the ops)

split = torch.ops.tileinfer_attn.decode_num_splits


@pytest.mark.parametrize("args,expected", [
    # (num_sms, num_seqs, num_kv_heads, max_q_len, group, head_dim, int8)
    ((132, 8, 8, 1, 4, 128, False), 4),     # 264 slots / 64 (sequence, head) pairs
    ((132, 8, 8, 1, 4, 128, True), 4),      # int8 too (decode.cu's wide int8 tile, two per SM)
    ((132, 1, 8, 1, 4, 128, False), 32),    # one sequence: capped at 32
    ((132, 1, 8, 1, 4, 128, True), 32),
    ((132, 32, 8, 1, 4, 128, True), 1),     # more pairs than slots: one split
    ((132, 8, 8, 1, 4, 256, True), 4),      # d 256
    ((132, 8, 8, 8, 4, 128, True), 4),      # 32 packed rows: the 64-row tile, two per SM
    ((132, 1, 8, 12, 1, 128, False), 32),   # 9-16 queries: the same rule
    ((132, 1, 8, 16, 4, 128, False), 32),   # 64 packed rows (the 64-row tile): the same rule
    ((0, 1, 2, 1, 4, 128, True), 8),        # CPU: 8 "SMs", two blocks each
])
def test_decode_num_splits(args, expected):
    assert split(*args) == expected


def test_decode_num_splits_defaults_are_bf16():
    assert split(132, 8, 8, 1) == split(132, 8, 8, 1, 1, 128, False) == 4
