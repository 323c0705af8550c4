"""Fused gated attention (Qiu et al., NeurIPS 2025) as a Triton kernel, plus a plain-PyTorch reference.

    from stability.kernels import gated_attention, reference_gated_attention

    y = gated_attention(q, k, v, gate)            # Triton, forward + backward
    y = reference_gated_attention(q, k, v, gate)  # PyTorch, any dtype (float64 for testing)

Importing this package on a machine without CUDA sets TRITON_INTERPRET=1 (unless it is
already set) so the kernels run on CPU in the Triton interpreter. Without triton installed,
`gated_attention` raises RuntimeError; the reference still works.

The folder is this package under the name ``stability.kernels`` only (the package mapping in
pyproject.toml). With the repository root on ``sys.path`` (``python -m pytest``, ``python -c``, a
notebook started there) it is also found as a top-level ``kernels``: the name of the Hugging Face
hub-kernels package, which transformers imports (a dependency of it since transformers 5.25). Under
that name the folder hands the name over to the installed hub-kernels package (found on ``sys.path``
past the repository root) and defines nothing itself; with none installed it stays empty, so the probe
finds no usable hub-kernels package.
"""

if __name__ == "kernels":   # see above: the top-level name belongs to the hub-kernels package
    import importlib.machinery as _machinery
    import importlib.util as _util
    import os as _os
    import sys as _sys

    _root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    _elsewhere = [p for p in _sys.path if _os.path.abspath(p or _os.getcwd()) != _root]
    _installed = _machinery.PathFinder.find_spec("kernels", _elsewhere)
    if _installed is not None and _installed.loader is not None:
        _itself = _sys.modules["kernels"]
        _sys.modules["kernels"] = _module = _util.module_from_spec(_installed)
        try:
            _installed.loader.exec_module(_module)
        except BaseException:
            _sys.modules["kernels"] = _itself
            raise
else:
    from .reference import reference_gated_attention

    try:
        from .gated_attention import (
            SUPPORTED_HEAD_DIMS,
            GatedAttentionFunction,
            gated_attention,
            poison_outputs,
        )
    except ImportError as _exc:  # only a missing triton is tolerated
        if not (_exc.name or "").startswith("triton"):
            raise
        _TRITON_ERROR = _exc
        SUPPORTED_HEAD_DIMS = ()

        def _unavailable():
            return RuntimeError(f"stability.kernels.gated_attention needs triton, which failed to import: {_TRITON_ERROR}")

        def gated_attention(q, k, v, gate=None, causal=True, scale=None):
            raise _unavailable()

        class GatedAttentionFunction:  # placeholder with the same name; fails on use
            @staticmethod
            def apply(*args, **kwargs):
                raise _unavailable()

        def poison_outputs(value=float("nan")):
            raise _unavailable()

    __all__ = [
        "SUPPORTED_HEAD_DIMS",
        "GatedAttentionFunction",
        "gated_attention",
        "poison_outputs",
        "reference_gated_attention",
    ]
