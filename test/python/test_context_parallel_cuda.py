"""Context parallelism on the CUDA backend against cp=1 on the same GPU: the
cases of bench/gpu/cp_check.py (a tiny LLaMA with GQA and rotary; cp=2 and
cp=4 a2a, cp=2 ring on the host, cp=2 and cp=4 with the device ring; fp32
within 1e-4, bf16 within 2e-2 over 20 steps; an a2a plan without its causal
mask must fail). CTest label `gpu`; skipped without a GPU or where mapp-run
has no CUDA backend. MAPP_CP_CUDA_PLANS=DIR takes the plans and weights
`cp_check.py --prepare DIR` compiled elsewhere (a GPU machine without
mapp-opt's LLVM)."""
import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "bench", "gpu"))
import cp_check  # noqa: E402


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    smi = shutil.which("nvidia-smi")
    if not smi or subprocess.run([smi, "-L"], capture_output=True).returncode:
        pytest.skip("no GPU visible")
    return cp_check.Runner(tmp_path_factory.mktemp("cp-cuda"),
                           os.environ.get("MAPP_CP_CUDA_PLANS"))


def checked(fn, *args):
    try:
        return fn(*args)
    except cp_check.CheckError as e:
        if "--backend=cuda is not built" in str(e):
            pytest.skip("mapp-run built without the CUDA backend")
        raise


@pytest.mark.parametrize("storage", sorted(cp_check.TOLERANCE))
@pytest.mark.parametrize("layout", sorted(cp_check.LAYOUTS))
def test_cuda_cp_matches_one_rank(runner, layout, storage):
    ok, msg = checked(cp_check.check_layout, runner, layout, storage)
    print(msg)
    assert ok, msg


def test_cuda_broken_cp_fails(runner):
    ok, msg = checked(cp_check.check_broken, runner)
    print(msg)
    assert ok, msg
