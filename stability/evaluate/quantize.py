"""Post-training quantization: how much a trained arm loses when its Linears are quantized.

The argument of Qiu et al. (2025) and Bondarenko et al. (2023): massive activations make a
quantizer stretch its range, so the many small values collapse; a gated model, with smaller
activations, should lose less. ``evaluate_schemes`` measures it for one trained model: the
held-out loss, perplexity and next-token accuracy in full precision (fp32) and after each
scheme, on the same fixed held-out batches the trainer uses, and the damage (quantized minus
full precision). The trained model is never touched: every scheme quantizes a deep copy.

Schemes (``SCHEMES``, each registered once below with ``register``; every nn.Linear of the blocks,
the gate projection included):

    int8            bitsandbytes LLM.int8() (Linear8bitLt, threshold 6.0): int8 weights (per
                    output row) and int8 activations (per token), except the input columns
                    holding a value above 6, which are multiplied in fp16 (outlier decomposition)
    int8-nooutlier  the same without the decomposition (threshold 0.0): plain int8
    nf4, fp4        bitsandbytes Linear4bit: 4-bit weights (blocks of 64, double-quantized
                    statistics), activations unquantized, fp32 compute
    w8a8-tensor     simulated W8A8, one absmax scale per tensor for the weight and for the
                    input of every call (fake quant: quantize-dequantize, fp32 matmul)
    w8a8-token      simulated W8A8, per-output-channel weights and per-token activations
    fp8             e4m3 weights and activations, per-tensor current scaling, through
                    ``stability.precision``'s own fp8 Linear (emulated: quantize-dequantize)
    torchao-int8wo  torchao ``Int8WeightOnlyConfig``: int8 weights (one scale per output row),
                    activations unquantized
    torchao-int4wo  torchao ``IntxWeightOnlyConfig(weight_dtype=torch.int4, PerGroup(32))``: int4
                    weights, one scale per group of 32 input columns, activations unquantized (the
                    int4 weight-only recipe that runs on the CPU; ``Int4WeightOnlyConfig`` needs a
                    GPU kernel package)
    torchao-fp8dq   torchao ``Float8DynamicActivationFloat8WeightConfig(PerRow())``: e4m3 weights
                    and activations, one dynamic scale per row (torchao runs it on GPUs of compute
                    capability 8.9 and above only: skipped elsewhere, with torchao's reason)

The LM head and the embeddings stay in full precision unless ``quantize_head=True`` (the
head then goes through the scheme too; the embeddings always stay). A scheme that the
installed bitsandbytes or the device cannot run is reported as ``{"skipped": reason}``.

Besides the loss damage, each scheme reports ``kl``: the mean per-token KL divergence
KL(p_full || p_quantized) of the next-token distributions on the probe batch. It is never
negative and grows with the quantization error, so it ranks schemes and models even where the
loss damage is noise-signed (a barely trained smoke model can get a LOWER held-out loss from a
quantizer that blurs its overconfident predictions).

What a scheme measured, proved: each result names the Linears the scheme declares it quantizes
(``targeted``: every nn.Linear of every block, read from the model's blocks apart from the code that
replaces them, and the head with ``quantize_head``) and those the quantized copy holds a quantized module
for (``replaced``), and says whether the quantized model's logits on the probe batch are bit-identical to
the full-precision model's (``unchanged``: nothing was quantized). ``quant_figures`` turns them into the
outcomes ``quant_<scheme>_missed`` (targeted, not replaced) and ``quant_<scheme>_unchanged``.

Per Linear the result holds the kurtosis and infinity norm of its input on the probe batch
(Bondarenko et al.'s predictors of W8A8 damage; definitions in ``stability.train.probes``) and
``damage``: the relative output error ``||Q(x) - f(x)|| / ||f(x)||`` of that Linear alone
under the scheme, fed the full-precision input x of the probe batch. It costs one extra
matmul per Linear, and says which layers the outliers break.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from stability.config import ConfigError, PrecisionConfig, RunConfig
from stability.data import Corpus, eval_batches, probe_batch
from stability.precision import PrecisionPolicy, ao, plain_linears
from stability.record import library_version
from stability.train import probes
from stability.train.evaluate import evaluate

PER_LINEAR_DAMAGE = ("relative L2 output error ||Q(x) - f(x)|| / ||f(x)|| of each Linear alone under the "
                     "scheme, fed its full-precision input, on the probe batch")
HEAD = "lm_head"  # the name of the LM head in the per-Linear figures when quantize_head=True


# ----------------------------------------------------------------------------- fake quant

def fake_quant_int8(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Symmetric absmax int8 quantize-dequantize: ``round(x / s).clamp(-127, 127) * s`` with
    ``s = amax / 127``; amax over the whole tensor (``dim=None``, per tensor) or over ``dim``
    (per slice: ``dim=-1`` on activations is per token, ``dim=1`` on a weight (out, in) is per
    output channel). An all-zero tensor (or slice) stays zero. Same dtype as ``x``."""
    x32 = x.float()
    magnitude = x32.abs()
    amax = magnitude.amax() if dim is None else magnitude.amax(dim=dim, keepdim=True)
    scale = torch.where(amax > 0, amax, torch.ones_like(amax)) / 127.0
    return (torch.round(x32 / scale).clamp(-127, 127) * scale).to(x.dtype)


class FakeQuantLinear(nn.Module):
    """A Linear whose weight is quantize-dequantized once and whose input is quantize-dequantized
    on every call (simulated W8A8). ``act_dim`` is None (per tensor) or -1 (per token).
    ``zeroed`` / ``nonzero`` count (as device tensors) the non-zero input values the activation
    quantizer turned to zero / all non-zero input values seen."""

    def __init__(self, linear: nn.Linear, weight_dim: int | None, act_dim: int | None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(fake_quant_int8(linear.weight.detach(), weight_dim), requires_grad=False)
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.act_dim = act_dim
        self.zeroed = 0
        self.nonzero = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = fake_quant_int8(x, self.act_dim)
        nonzero = x != 0
        self.zeroed = self.zeroed + (nonzero & (q == 0)).sum()  # device tensors: no host sync per call
        self.nonzero = self.nonzero + nonzero.sum()
        return F.linear(q, self.weight, self.bias)


# ----------------------------------------------------------------------------- scheme builders

@contextlib.contextmanager
def _quiet_bitsandbytes():
    """bitsandbytes logs a warning on every int8 call with fp32 inputs (they are cast to fp16,
    which the record states); silence its loggers for the evaluation only."""
    logger = logging.getLogger("bitsandbytes")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _cpu_state(linear: nn.Linear) -> dict:
    return {k: v.detach().to("cpu", torch.float32) for k, v in linear.state_dict().items()}


def _bnb_int8(linear: nn.Linear, device: torch.device, threshold: float) -> nn.Module:
    """bitsandbytes Linear8bitLt; the weight is quantized when the module moves to ``device``."""
    import bitsandbytes as bnb

    module = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, bias=linear.bias is not None,
                                 has_fp16_weights=False, threshold=threshold)
    module.load_state_dict(_cpu_state(linear))
    return module.to(device).eval()


def _bnb_4bit(linear: nn.Linear, device: torch.device, quant_type: str) -> nn.Module:
    """bitsandbytes Linear4bit with fp32 compute; the weight is quantized when it moves to ``device``.

    On CPUs with AVX512-BF16, bitsandbytes would switch inference to a packed kernel that computes
    in bf16 (and needs out_features % 32 == 0); it is turned off so the compute stays fp32 and
    the damage is the 4-bit weights' alone."""
    import bitsandbytes as bnb

    module = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                               compute_dtype=torch.float32, quant_type=quant_type)
    module.load_state_dict(_cpu_state(linear))
    module = module.to(device).eval()
    if not getattr(module.weight, "bnb_quantized", False):
        raise RuntimeError(f"bitsandbytes did not quantize the {quant_type} weight on {device}")
    module.support_avx512bf16_for_cpu = False
    return module


def _fp8(linear: nn.Linear, device: torch.device, policy: PrecisionPolicy) -> nn.Module:
    """A copy of ``linear`` made an e4m3 fp8 Linear (per-tensor current scaling) by the precision policy."""
    module = copy.deepcopy(linear)
    return policy.prepare(module).eval()


def _torchao(linear: nn.Linear, device: torch.device, config) -> nn.Module:
    """A copy of ``linear`` on ``device`` with its weight quantized by ``torchao.quantization.quantize_``."""
    from torchao.quantization import quantize_

    holder = nn.Sequential(copy.deepcopy(linear).to(device))  # quantize_ swaps children of a module
    quantize_(holder, config)
    return holder[0].eval()


# ----------------------------------------------------------------------------- the schemes

Builder = Callable[[torch.device], tuple[Callable[[nn.Linear], nn.Module], dict]]


@dataclass(frozen=True)
class Scheme:
    """One post-training quantization scheme.

    name: what ``quant_schemes`` and ``--quant`` call it. library: who implements it ("bitsandbytes",
    "torchao", or "stability" for the ones simulated here); the record states its installed version.
    method: the recipe in words, for the record. build(device): (a function that turns one nn.Linear
    into its quantized module on ``device``, facts for the record such as the compute dtype), made once
    per evaluation. A build or a quantized module that cannot run here (library missing, device
    unable) makes the scheme "skipped" with the reason, not a failed run."""

    name: str
    library: str
    method: str
    build: Builder


SCHEMES: dict[str, Scheme] = {}  # name -> scheme, in the order ``--quant all`` evaluates them


def register(name: str, library: str, method: str) -> Callable[[Builder], Builder]:
    """Decorator: register the decorated ``build(device)`` as the scheme ``name`` (a name not taken)."""
    def add(build: Builder) -> Builder:
        if name in SCHEMES:
            raise ValueError(f"quantization scheme {name!r} is registered already")
        SCHEMES[name] = Scheme(name, library, method, build)
        return build
    return add


def check_schemes(schemes) -> tuple[str, ...]:
    """The schemes as a tuple; ConfigError naming any unknown one and listing the registered ones."""
    schemes = tuple(schemes)
    unknown = [s for s in schemes if s not in SCHEMES]
    if unknown:
        raise ConfigError(f"quant_schemes={schemes!r} is invalid: expected names from {tuple(SCHEMES)} "
                          f"(unknown: {unknown})")
    return schemes


@register("int8", "bitsandbytes", "bitsandbytes LLM.int8() Linear8bitLt, has_fp16_weights=False, threshold=6.0 "
          "(int8 weights per row, int8 activations per token, outlier columns in fp16)")
def _int8(device):
    return (lambda lin: _bnb_int8(lin, device, 6.0)), {
        "compute_dtype": "float16", "threshold": 6.0,
        "note": "bitsandbytes casts activations to fp16 before int8 quantization"}


@register("int8-nooutlier", "bitsandbytes",
          "bitsandbytes Linear8bitLt, has_fp16_weights=False, threshold=0.0 (plain int8)")
def _int8_nooutlier(device):
    return (lambda lin: _bnb_int8(lin, device, 0.0)), {
        "compute_dtype": "float16", "threshold": 0.0,
        "note": "bitsandbytes casts activations to fp16 before int8 quantization"}


@register("nf4", "bitsandbytes", "bitsandbytes Linear4bit nf4, blocksize 64, double-quantized absmax; "
          "activations unquantized")
def _nf4(device):
    return (lambda lin: _bnb_4bit(lin, device, "nf4")), {"compute_dtype": "float32", "blocksize": 64}


@register("fp4", "bitsandbytes", "bitsandbytes Linear4bit fp4, blocksize 64, double-quantized absmax; "
          "activations unquantized")
def _fp4(device):
    return (lambda lin: _bnb_4bit(lin, device, "fp4")), {"compute_dtype": "float32", "blocksize": 64}


@register("w8a8-tensor", "stability", "simulated int8 weights and activations, one absmax scale per tensor (per "
          "call for activations); quantize-dequantize then fp32 matmul")
def _w8a8_tensor(device):
    return (lambda lin: FakeQuantLinear(lin, None, None).to(device)), {"compute_dtype": "float32"}


@register("w8a8-token", "stability", "simulated int8, per-output-channel weight scales, per-token activation "
          "scales; quantize-dequantize then fp32 matmul")
def _w8a8_token(device):
    return (lambda lin: FakeQuantLinear(lin, 1, -1).to(device)), {"compute_dtype": "float32"}


@register("fp8", "stability", "e4m3 weights and activations, per-tensor current scaling (stability.precision's "
          "own fp8 Linear, emulated); fp32 matmul")
def _fp8_scheme(device):
    policy = PrecisionPolicy(PrecisionConfig(dtype="fp8", fp8_recipe="own", fp8_scaling="current"),
                             str(device), real_fp8=False)
    return (lambda lin: _fp8(lin, device, policy)), {"compute_dtype": "float32", "fp8_format": "e4m3",
                                                     "_policy": policy}


@register("torchao-int8wo", "torchao", "torchao Int8WeightOnlyConfig: int8 weights, one scale per output row; "
          "activations unquantized")
def _torchao_int8wo(device):
    ao.load()
    import torchao.quantization as tq

    config = tq.Int8WeightOnlyConfig()
    return (lambda lin: _torchao(lin, device, config)), {"compute_dtype": "float32"}


@register("torchao-int4wo", "torchao", "torchao IntxWeightOnlyConfig(weight_dtype=int4, granularity=PerGroup(32)): "
          "int4 weights, one scale per group of 32 inputs; activations unquantized")
def _torchao_int4wo(device):
    ao.load()
    import torchao.quantization as tq
    from torchao.quantization.granularity import PerGroup

    config = tq.IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))
    return (lambda lin: _torchao(lin, device, config)), {"compute_dtype": "float32"}


@register("torchao-fp8dq", "torchao", "torchao Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()): "
          "e4m3 weights and activations, dynamic per-row scales")
def _torchao_fp8dq(device):
    ao.load()
    import torchao.quantization as tq
    from torchao.quantization.granularity import PerRow

    config = tq.Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())
    return (lambda lin: _torchao(lin, device, config)), {"compute_dtype": "float32"}


# ----------------------------------------------------------------------------- model surgery

class _QuantizedHead(nn.Module):
    """A GatedLM whose output logits come from a (quantized) head module fed the final-norm output."""

    def __init__(self, lm: nn.Module, head: nn.Module):
        super().__init__()
        self.lm = lm
        self.head = head

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = []
        handle = self.lm.norm.register_forward_hook(lambda _m, _i, out: hidden.append(out))
        try:
            self.lm(tokens)
        finally:
            handle.remove()
        return self.head(hidden[0])


def full_precision_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` in eval mode with every Linear a precision recipe converted (fp8,
    MX) turned back into a plain nn.Linear (same parameters): the fp32 reference the schemes start
    from. Hooks on the model (the precision policy's counters) are not copied along."""
    reference = copy.deepcopy(model)
    for module in reference.modules():
        module._forward_pre_hooks.clear()
        module._forward_hooks.clear()
    return plain_linears(reference).eval()


def target_linears(model: nn.Module) -> list[str]:
    """Names of the Linears a scheme quantizes: every nn.Linear inside the blocks (q, k, v, o,
    gate and MLP projections); not the embeddings, not the LM head."""
    return [name for name, module in model.named_modules()
            if name.startswith("blocks.") and isinstance(module, nn.Linear)]


def declared_targets(model: nn.Module, quantize_head: bool = False) -> list[str]:
    """The Linears every scheme declares it quantizes, read from the model's blocks (``model.block_names``):
    each nn.Linear inside a block, and the head (``HEAD``) with ``quantize_head``. Stated apart from
    ``target_linears``, which the replacing code walks, so that a change there shows as a Linear missed."""
    inside = [f"{block}.{name}" for block in model.block_names
              for name, module in model.get_submodule(block).named_modules() if isinstance(module, nn.Linear)]
    return inside + ([HEAD] if quantize_head else [])


def replaced_linears(reference: nn.Module, quantized: nn.Module, names: list[str]) -> list[str]:
    """The names among ``names`` for which ``quantized`` (a copy made by ``quantize_model``) holds a quantized
    module: one of another class than the reference Linear's, or whose weight is of another class (torchao
    swaps the weight for a quantized tensor and keeps the nn.Linear). ``HEAD``: the head module of a copy
    made with ``quantize_head``, against a plain nn.Linear."""
    head = quantized.head if isinstance(quantized, _QuantizedHead) else None
    inner = quantized.lm if head is not None else quantized
    replaced = []
    for name in names:
        if name == HEAD:
            before, after = _head_linear(reference), head
        else:
            before, after = reference.get_submodule(name), inner.get_submodule(name)
        if after is not None and (type(after) is not type(before)
                                  or type(getattr(after, "weight", None)) is not type(before.weight)):
            replaced.append(name)
    return replaced


def _head_linear(model: nn.Module) -> nn.Linear:
    """The LM head as an nn.Linear (a copy of the tied embedding matrix when tied)."""
    weight = model.embed.weight if model.lm_head is None else model.lm_head.weight
    head = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device)
    with torch.no_grad():
        head.weight.copy_(weight)
    return head


def quantize_model(model: nn.Module, scheme: str, quantize_head: bool = False,
                   device: str | torch.device | None = None) -> tuple[nn.Module, dict]:
    """A quantized deep copy of ``model`` (a full-precision GatedLM, see ``full_precision_copy``)
    and the facts of the scheme for the record. ``model`` itself is not changed."""
    check_schemes((scheme,))
    device = torch.device(device) if device is not None else next(model.parameters()).device
    build, facts = SCHEMES[scheme].build(device)
    quantized = copy.deepcopy(model).eval()
    for name in target_linears(model):
        parent_name, _, attr = name.rpartition(".")
        setattr(quantized.get_submodule(parent_name), attr, build(model.get_submodule(name)))
    if quantize_head:
        quantized = _QuantizedHead(quantized, build(_head_linear(model))).eval()
    return quantized, facts


def _linear_modules(quantized: nn.Module, names: list[str]) -> dict[str, nn.Module]:
    """name -> module of the quantized Linears of a copy made by ``quantize_model`` (``names`` from
    the reference it was made from; ``HEAD`` is the quantized head)."""
    inner = quantized.lm if isinstance(quantized, _QuantizedHead) else quantized
    return {name: (quantized.head if name == HEAD else inner.get_submodule(name)) for name in names}


# ----------------------------------------------------------------------------- per-Linear figures

def _capture_inputs(reference: nn.Module, names: list[str], tokens: torch.Tensor,
                    visit: Callable[[str, torch.Tensor], None]) -> None:
    """Run ``reference`` on ``tokens`` and call ``visit(name, input)`` for the input of every Linear
    in ``names`` (``HEAD``: the final-norm output the head sees), with forward pre-hooks."""
    def pre_hook(name):
        def hook(_module, inputs):
            visit(name, inputs[0])  # returns None: the inputs are not replaced
        return hook

    def head_hook(_module, _inputs, output):
        visit(HEAD, output)  # returns None: the output is not replaced

    handles = []
    for name in names:
        if name == HEAD:
            handles.append(reference.norm.register_forward_hook(head_hook))
        else:
            handles.append(reference.get_submodule(name).register_forward_pre_hook(pre_hook(name)))
    try:
        with torch.no_grad():
            reference(tokens)
    finally:
        for handle in handles:
            handle.remove()


def linear_input_stats(reference: nn.Module, tokens: torch.Tensor, names: list[str] | None = None) -> dict:
    """Per Linear: kurtosis (``probes.kurtosis``) and infinity norm of its input on ``tokens``.
    Linears that read the same tensor (q, k, v and gate; the MLP's gate and up) share one computation."""
    names = target_linears(reference) if names is None else names
    stats: dict[str, dict] = {}
    seen: dict[int, tuple[torch.Tensor, dict]] = {}

    def visit(name, x):
        if id(x) not in seen:  # the tensor is kept alive in ``seen``, so its id is not reused
            figures = {"kurtosis": probes.kurtosis(x), "inf_norm": x.detach().float().abs().max().item()}
            seen[id(x)] = (x, figures)
        stats[name] = dict(seen[id(x)][1])
    _capture_inputs(reference, names, tokens, visit)
    return stats


def relative_output_error(reference_out: torch.Tensor, quantized_out: torch.Tensor) -> float:
    """``||q - r|| / ||r||`` in fp32 (inf when r is all zero and q is not, 0 when both are)."""
    r, q = reference_out.detach().float(), quantized_out.detach().float()
    diff, norm = torch.linalg.vector_norm(q - r).item(), torch.linalg.vector_norm(r).item()
    return diff / norm if norm > 0 else (0.0 if diff == 0 else float("inf"))


def output_kl(reference: nn.Module, quantized: nn.Module, tokens: torch.Tensor) -> float:
    """Mean over tokens of KL(p_reference || p_quantized) of the next-token distributions, in nats."""
    return compare_outputs(reference, quantized, tokens)[0]


def compare_outputs(reference: nn.Module, quantized: nn.Module, tokens: torch.Tensor) -> tuple[float, bool]:
    """(``output_kl``, whether the two models' logits on ``tokens`` are bit-identical), from one forward each."""
    with torch.no_grad():
        logits_p, logits_q = reference(tokens), quantized(tokens)
        log_p = logits_p.float().log_softmax(-1)
        log_q = logits_q.float().log_softmax(-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean().item(), torch.equal(logits_p, logits_q)


def per_linear_damage(reference: nn.Module, quantized: dict[str, nn.Module], tokens: torch.Tensor) -> dict:
    """Per Linear name: relative output error of ``quantized[name]`` against the full-precision
    Linear, both fed the full-precision input of ``tokens`` (see the module docstring)."""
    damage: dict[str, float] = {}
    head = _head_linear(reference) if HEAD in quantized else None

    def visit(name, x):
        ref_module = head if name == HEAD else reference.get_submodule(name)
        ref = F.linear(x, ref_module.weight, ref_module.bias)
        damage[name] = relative_output_error(ref, quantized[name](x))
    with _quiet_bitsandbytes():
        _capture_inputs(reference, list(quantized), tokens, visit)
    return damage


# ----------------------------------------------------------------------------- the entry point

def _fp32_policy(device: str) -> PrecisionPolicy:
    return PrecisionPolicy(PrecisionConfig(dtype="fp32"), device)


def evaluate_schemes(model: nn.Module, corpus: Corpus, run: RunConfig, schemes: tuple[str, ...],
                     quantize_head: bool = False, per_linear: bool = True) -> dict:
    """Full-precision and per-scheme held-out figures of a trained ``model`` (see module docstring).

    Returns (JSON-ready)::

        {"full_precision": {"heldout_loss", "perplexity", "accuracy"}, "reference_dtype": "fp32",
         "head_quantized": bool, "embeddings_quantized": False, "per_linear_damage": <definition>,
         "schemes": {name: {"heldout_loss", "perplexity", "accuracy", "damage_loss",
                            "damage_perplexity", "damage_accuracy", "kl", "seconds", "compute_dtype", ...,
                            "per_linear": {linear: {"kurtosis", "inf_norm", "damage"}}}
                         or {"skipped": reason}}}

    Unknown scheme names raise ConfigError before any work; a scheme that fails to quantize or
    run (bitsandbytes or device unable) is recorded as skipped with the reason."""
    schemes = check_schemes(schemes)
    device = run.device
    batches = eval_batches(corpus, run.probes.eval_batches, run.data.batch_size, run.model.context,
                           run.data.bos, device)
    probe_x, _ = probe_batch(corpus, run.probes.probe_batch_size, run.model.context, run.data.bos, device)
    policy = _fp32_policy(device)
    reference = full_precision_copy(model)
    full = evaluate(reference, batches, policy)
    names = target_linears(reference) + ([HEAD] if quantize_head else [])
    stats = linear_input_stats(reference, probe_x, names) if per_linear else {}
    out = {"full_precision": full, "reference_dtype": "fp32", "head_quantized": bool(quantize_head),
           "embeddings_quantized": False, "eval_batches": len(batches),
           "per_linear_damage": PER_LINEAR_DAMAGE if per_linear else None, "schemes": {}}
    for scheme in schemes:
        if not math.isfinite(full["heldout_loss"]):
            out["schemes"][scheme] = {"skipped": "the full-precision held-out loss is not finite (the arm "
                                                 "diverged): there is no function left to quantize"}
            continue
        out["schemes"][scheme] = _one_scheme(reference, scheme, batches, probe_x, policy, full, stats,
                                             quantize_head, per_linear, device)
    return out


def scheme_source(scheme: str) -> dict:
    """{"library", "version", "method"} of a scheme: who implements it, which version is installed
    (None when it is not), and the recipe."""
    entry = SCHEMES[scheme]
    library = entry.library
    return {"library": library, "version": library_version("stability" if library == "stability" else library),
            "method": entry.method}


def _one_scheme(reference, scheme, batches, probe_x, policy, full, stats, quantize_head, per_linear,
                device) -> dict:
    started = time.perf_counter()
    names = target_linears(reference) + ([HEAD] if quantize_head else [])
    source = scheme_source(scheme)
    try:
        with _quiet_bitsandbytes():
            quantized, facts = quantize_model(reference, scheme, quantize_head, device)
            figures = evaluate(quantized, batches, policy)
            counts = _cast_counts(_linear_modules(quantized, names).values(), facts.pop("_policy", None))
            kl, unchanged = compare_outputs(reference, quantized, probe_x)
    except (ImportError, ao.TorchaoMissing) as error:
        return {"skipped": f"{scheme} needs {source['library']}, which cannot be imported: {error}", **source}
    except Exception as error:  # noqa: BLE001 - the library or device cannot run it: say why, go on
        return {"skipped": f"{scheme} cannot run on {device}: {type(error).__name__}: {error}", **source}
    targeted = declared_targets(reference, quantize_head)
    result = {**figures, **damage(figures, full), "kl": kl, **source, **facts, **counts, "targeted": targeted,
              "replaced": replaced_linears(reference, quantized, targeted), "unchanged": unchanged}
    if per_linear:
        modules = _linear_modules(quantized, names)
        try:
            errors = per_linear_damage(reference, modules, probe_x)
        except Exception as error:  # noqa: BLE001 - the figures above stand; say why these are missing
            errors = {}
            result["per_linear_error"] = f"{type(error).__name__}: {error}"
        result["per_linear"] = {name: {**stats.get(name, {}),
                                       **({"damage": errors[name]} if name in errors else {})}
                                for name in modules}
    result["seconds"] = time.perf_counter() - started
    return result


def damage(figures: dict, full: dict) -> dict[str, float]:
    """Quantized minus full-precision held-out figures: loss and perplexity (positive = worse) and
    accuracy (negative = worse)."""
    return {"damage_loss": figures["heldout_loss"] - full["heldout_loss"],
            "damage_perplexity": figures["perplexity"] - full["perplexity"],
            "damage_accuracy": figures["accuracy"] - full["accuracy"]}


def _cast_counts(modules, fp8_policy: PrecisionPolicy | None) -> dict[str, float]:
    """What the quantizers did to the values during the held-out evaluation: W8A8, the fraction of
    non-zero Linear inputs rounded to zero ("activation_zeroed_fraction"); fp8, the precision
    policy's overflow / underflow fractions (weights and inputs cast to e4m3)."""
    fake = [m for m in modules if isinstance(m, FakeQuantLinear)]
    out = {}
    if fake:
        nonzero = sum(int(m.nonzero) for m in fake)
        out["activation_zeroed_fraction"] = sum(int(m.zeroed) for m in fake) / nonzero if nonzero else 0.0
    if fp8_policy is not None:
        cast = fp8_policy.pop_stats()
        out.update(overflow_fraction=cast["overflow_fraction"], underflow_fraction=cast["underflow_fraction"])
    return out


# ----------------------------------------------------------------------------- record helpers

def quant_figures(quant: dict | None) -> dict[str, float]:
    """Flat figures for an arm's "final" entry and the paired comparison: ``quant_<scheme>_damage_loss``,
    ``quant_<scheme>_damage_accuracy`` and ``quant_<scheme>_kl`` of every scheme that ran, and where the
    result says what it replaced, the outcomes ``quant_<scheme>_missed`` (Linears targeted and not replaced)
    and ``quant_<scheme>_unchanged`` (1: the quantized logits equal the full-precision ones bit for bit)."""
    out = {}
    for scheme, figures in ((quant or {}).get("schemes") or {}).items():
        if "skipped" in figures:
            continue
        out[f"quant_{scheme}_damage_loss"] = figures["damage_loss"]
        out[f"quant_{scheme}_damage_accuracy"] = figures["damage_accuracy"]
        out[f"quant_{scheme}_kl"] = figures["kl"]
        if "targeted" in figures:
            out[f"quant_{scheme}_missed"] = len(set(figures["targeted"]) - set(figures["replaced"]))
            out[f"quant_{scheme}_unchanged"] = int(figures["unchanged"])
    return out


# ----------------------------------------------------------------------------- planted outliers

@torch.no_grad()
def plant_outliers(model: nn.Module, channels: tuple[int, ...] = (3, 17), factor: float = 64.0,
                   layers: tuple[int, ...] | None = None, norms: tuple[str, ...] = ("attn_norm", "mlp_norm")
                   ) -> nn.Module:
    """Plant outlier features in place without changing the model's function: multiply the gain
    of ``channels`` in the given pre-norms by ``factor`` and divide the same input columns of every
    Linear that reads that norm's output. The Linear inputs then carry values ``factor`` times
    larger in those channels (the outlier features of Dettmers et al. 2022 / massive activations
    of Sun et al. 2024 as a quantizer sees them). Returns ``model``."""
    _check_plant(model, channels, factor, norms)
    index = torch.tensor(channels, dtype=torch.long)
    for number, block in enumerate(model.blocks):
        if layers is not None and number not in layers:
            continue
        for norm_name in norms:
            norm = getattr(block, norm_name)
            norm.weight[index.to(norm.weight.device)] *= factor
            for linear in _norm_readers(block, norm_name):
                linear.weight[:, index.to(linear.weight.device)] /= factor
    return model


def _norm_readers(block: nn.Module, norm_name: str) -> list[nn.Linear]:
    """The Linears of a block that read the output of its ``norm_name`` pre-norm."""
    attn = block.attn
    found = (attn.q_proj, attn.k_proj, attn.v_proj, attn.gate_proj) if norm_name == "attn_norm" \
        else (block.mlp.w_gate, block.mlp.w_up)
    return [m for m in found if m is not None]


def _check_plant(model: nn.Module, channels, factor, norms) -> None:
    if not norms or any(n not in ("attn_norm", "mlp_norm") for n in norms):
        raise ConfigError(f"norms={norms!r} is invalid: expected a non-empty tuple of 'attn_norm' and/or "
                          f"'mlp_norm'")
    width = model.config.d_model
    if not channels or any(not 0 <= c < width for c in channels):
        raise ConfigError(f"channels={channels!r} is invalid: expected channel indices in [0, {width})")
    if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
        raise ConfigError(f"factor={factor!r} is invalid: expected a positive finite number")
