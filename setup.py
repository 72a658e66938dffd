"""sglang-prorsa: adaptive PD disaggregation for agentic RL rollouts on top of a pinned SGLang.

The folder ``kernels/`` is installed as ``sglang_prorsa.kernels``: PyPI has a package named ``kernels`` (a dependency
of sglang) and a top-level package of that name would shadow it.
"""

import os
import sys

# The build runs with this folder on sys.path, where ./kernels would shadow PyPI's `kernels`, whose setuptools
# plugin (kernels.lockfile) the build loads. Nothing here imports from the checkout, so drop the folder.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

from setuptools import find_packages, setup  # noqa: E402

SGLANG_VERSION = "0.5.23"

setup(
    name="sglang-prorsa",
    version="0.1.0",
    description="Adaptive prefill-decode disaggregation with busy-instance role switching for agentic RL rollouts",
    python_requires=">=3.10",
    packages=find_packages(include=["sglang_prorsa", "sglang_prorsa.*"]) + ["sglang_prorsa.kernels"],
    package_dir={"sglang_prorsa.kernels": "kernels"},
    install_requires=[
        f"sglang=={SGLANG_VERSION}",
        "torch==2.14.1",
        "transformers",
        "tokenizers",
        "tqdm",
        "requests",
        "matplotlib",
        "ninja",
    ],
    extras_require={
        # Machines without CUDA: the non-CUDA Mooncake build (the CUDA one needs libcudart).
        "cpu": ["mooncake-transfer-engine-non-cuda==0.3.13.post1"],
        "gpu": ["mooncake-transfer-engine==0.3.13.post1"],
        "test": ["pytest==8.4.2", "pytest-timeout==2.4.0", "hypothesis==6.140.3"],
    },
)
