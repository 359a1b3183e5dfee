"""AttentionMetadata: built from host lists, and static buffers updated in place
for CUDA-graph replays (padded slots: length 0, no queries)."""
import pytest
import torch

from tileinfer_attn.cache import PagedKVCache, StepMetadata
from tileinfer_attn.metadata import AttentionMetadata


def test_build_and_update_pad_the_remaining_slots():
    step = AttentionMetadata.build([[3, 1], [0], [2, 4]], [20, 5, 30], [1, 2, 1], "cpu")
    assert step.cu_seqlens_q.tolist() == [0, 1, 3, 4] and step.max_q_len == 2
    assert step.positions(4).tolist() == [19, 3, 4, 29]
    static = AttentionMetadata.static(max_seqs=5, max_pages=3, max_q_len=2, device="cpu")
    buffers = (static.block_tables.data_ptr(), static.seq_lens.data_ptr(), static.cu_seqlens_q.data_ptr())
    static.update_(step)
    assert (static.block_tables.data_ptr(), static.seq_lens.data_ptr(), static.cu_seqlens_q.data_ptr()) == buffers
    assert static.seq_lens.tolist() == [20, 5, 30, 0, 0]
    assert static.cu_seqlens_q.tolist() == [0, 1, 3, 4, 4, 4]
    assert static.block_tables[:3, :2].tolist() == [[3, 1], [0, 0], [2, 4]]
    with pytest.raises(ValueError, match="does not fit"):
        static.update_(AttentionMetadata.build([[1]] * 6, [1] * 6, [1] * 6, "cpu"))
    with pytest.raises(ValueError, match="causal"):
        static.update_(AttentionMetadata.build([[1]], [1], [1], "cpu", causal=False))


def test_cache_step_metadata_is_attention_metadata():
    cache = PagedKVCache(1, 8, 2, 64, page_size=16, dtype=torch.bfloat16, device="cpu", max_seqs=2)
    a = cache.add()
    md = cache.prepare_step([a], [5])
    assert isinstance(md, StepMetadata) and isinstance(md, AttentionMetadata)
    assert md.num_tokens == 5 and md.seqs == [a] and md.num_seqs == 1
    assert md.positions().tolist() == [0, 1, 2, 3, 4]
