"""README's main command, as README runs it: `python -m tileinfer_attn.demo` in a
fresh interpreter (so the package is imported before anything else imports
torch). The demo checks every step against float64 and exits non-zero on a
mismatch."""
import os
import subprocess
import sys

import pytest

from op_helpers import DEVICES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
@pytest.mark.parametrize("device", DEVICES)
def test_demo_runs_from_a_fresh_interpreter(device, dtype):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.run([sys.executable, "-m", "tileinfer_attn.demo", "--device", device, "--dtype", dtype],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-3000:]
    assert "OK: every step matches exact attention" in child.stdout
