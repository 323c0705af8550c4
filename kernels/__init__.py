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
hub-kernels package, which transformers probes for (``import transformers`` imports it). Under that
name it defines nothing and imports nothing, so the probe finds no usable hub-kernels package.
"""

if __name__ != "kernels":   # see above: as the top-level `kernels` the package stays empty
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
