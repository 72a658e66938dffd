"""sglang-prorsa: adaptive PD disaggregation for agentic RL rollouts on top of a pinned SGLang.

The folder ``kernels/`` is installed as ``sglang_prorsa.kernels``: PyPI has a package named ``kernels`` (a dependency
of sglang) and a top-level package of that name would shadow it.
"""

import importlib.util
import os
import sys

# The build runs with this folder on sys.path, where ./kernels would shadow PyPI's `kernels`, whose setuptools
# plugin (kernels.lockfile) the build loads. Nothing here imports from the checkout (pins.py is loaded by path),
# so drop the folder.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

from setuptools import find_packages, setup  # noqa: E402


def _load_pins():
    """``sglang_prorsa/srt/common/pins.py``, loaded by path (standard library only; the package is not importable
    yet): the pins' one source is requirements/base.txt, which it reads, here and at run time alike."""
    spec = importlib.util.spec_from_file_location("_prorsa_pins", os.path.join(_here, "sglang_prorsa", "srt", "common",
                                                                             "pins.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_pins = _load_pins()
PINS = _pins.requirement_pins()


def pin(name):
    return f"{name}=={_pins.pinned(name, PINS)}"


setup(
    name="sglang-prorsa",
    version="0.1.0",
    description="Adaptive prefill-decode disaggregation with busy-instance role switching for agentic RL rollouts",
    python_requires=">=3.10",
    packages=find_packages(include=["sglang_prorsa", "sglang_prorsa.*"]) + ["sglang_prorsa.kernels"],
    package_dir={"sglang_prorsa.kernels": "kernels"},
    install_requires=[
        pin("sglang"),
        pin("torch"),
        "transformers",
        "tokenizers",
        "tqdm",
        "requests",
        "matplotlib",
        "ninja",
    ],
    extras_require={
        # Machines without CUDA: the non-CUDA Mooncake build (the CUDA one needs libcudart).
        "cpu": [pin("mooncake-transfer-engine-non-cuda")],
        # The CUDA build is released beside the non-CUDA one under the same version; base.txt pins the latter.
        "gpu": [f"mooncake-transfer-engine=={_pins.pinned('mooncake-transfer-engine-non-cuda', PINS)}"],
        "test": [pin("pytest"), pin("pytest-timeout"), pin("hypothesis")],
    },
)
