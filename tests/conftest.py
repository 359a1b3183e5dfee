"""Shared pytest setup: GPU tests (marked ``gpu``) are skipped, with the reason
printed in the header and on every skipped test, where there is no CUDA device;
the `seed` fixture. The tests' helpers are in op_helpers.py."""
import zlib

import pytest
import torch

NO_GPU_REASON = "no CUDA device here (torch.cuda.is_available() is False): tests marked gpu are skipped"


def pytest_report_header(config):
    line = f"tileinfer_attn tests: torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}"
    if not torch.cuda.is_available():
        line += f"\n{NO_GPU_REASON}"
    return line


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=NO_GPU_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def seed(request):
    """A different, reproducible seed for every test case: the CRC-32 of its node id."""
    return zlib.crc32(request.node.nodeid.encode())
