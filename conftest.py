"""This repository's own pytest plumbing: hypothesis profiles, and the Triton interpreter on a machine
without CUDA.

Everything the suites use (options --preset, --device, --seeds, ..., markers, the session's run directory,
one GPU per xdist worker, the fixtures) comes from the stability pytest plugin
(``stability.plugin.pytest_plugin``), configured by ``[tool.stability]`` in pyproject.toml, as in any
repository that uses it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The tests import validation.* and benchmarks.* (folders of this repository, not of the package). The root goes
# at the end of sys.path, not the front (where pytest's `pythonpath` would put it): there the folder kernels/
# never shadows an installed top-level `kernels` (Hugging Face's hub-kernels package, which transformers imports
# when it is installed).
ROOT = str(Path(__file__).resolve().parent)
if ROOT not in sys.path:
    sys.path.append(ROOT)

# Triton kernels on a machine without CUDA run in the interpreter; this must be set before any kernel is
# defined, so it is set here, before tests import anything.
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # torch missing: the test run fails on its own, with a clearer message
    pass

from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=25, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=50)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
