"""What each training format's Linear calls must run in: the rule by which the record's proof judges every
Linear call of a training forward (``stability.train.applied.LinearFormats``, the record's
``applied.linear_calls.runs_in`` and the figure ``linear_off_format_calls``), stated here by the format's
registered name (``precision.dtype``), apart from the format classes whose code makes the Linears run in it
(``stability.precision.formats``).

Apart, because a rule read from the class that applies the format moves with it: an fp16 format whose
autocast dtype became bfloat16 would judge its calls by "bfloat16" and pass every one. Judged by this table,
every call of that rung is off its format.

    precision.dtype   a Linear call runs in          read by ``Format.ran_as`` as
    fp32              "float32"                      the call's output dtype
    bf16              "bfloat16"                     the call's output dtype (under torch.autocast)
    fp16              "float16"                      the call's output dtype (under torch.autocast)
    fp8               "Float8Linear"                 the Linear's class: torchao's float8 training
                      "Fp8Linear" when precision.fp8_recipe = "own" (the harness's own fp8 Linear)
    mxfp8, mxfp4      "MXLinear"                     the Linear's class: torchao's MX Linear

A rule is a string (what ``Format.ran_as`` reports of a call in the format), a function of the run's
``PrecisionConfig`` returning one (fp8: by its recipe), or None: no rule, so the format's Linear calls are
counted and none is judged (the record says ``"runs_in": null``, ``linear_in_format_share`` is None).

A format added with ``formats.register`` (docs/extending.md) states its rule first, with
``declare_linear_rule(name, rule)``: ``register`` refuses a name without one, so that no format goes unjudged
by omission (None, written out, is the one way to have no rule). Write the rule out; never read it from the
format class's own attributes (its ``dtype``), or the proof can no longer tell the format from what it does.
"""

from __future__ import annotations

from collections.abc import Callable

from stability.config import PrecisionConfig

Rule = str | Callable[[PrecisionConfig], str | None] | None


def fp8_rule(config: PrecisionConfig) -> str:
    """fp8's Linears: the harness's own ``Fp8Linear`` for ``fp8_recipe = "own"``, torchao's ``Float8Linear``
    for its recipes."""
    return "Fp8Linear" if config.fp8_recipe == "own" else "Float8Linear"


LINEAR_RULES: dict[str, Rule] = {   # precision.dtype -> what its Linear calls run in (see the module docstring)
    "fp32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp8": fp8_rule,
    "mxfp8": "MXLinear",
    "mxfp4": "MXLinear",
}


def declare_linear_rule(name: str, rule: Rule) -> None:
    """State what the Linear calls of the format ``name`` run in (a name not declared yet), before the format
    registers: a string as ``Format.ran_as`` reports it, a function of the run's ``PrecisionConfig``, or None
    (no rule: its calls counted, none judged)."""
    if not name or name in LINEAR_RULES:
        raise ValueError(f"Linear rule for training format {name!r}: expected a name without one yet")
    if not (rule is None or isinstance(rule, str) or callable(rule)):
        raise ValueError(f"Linear rule for training format {name!r}: expected a string, a function of the run's "
                         f"PrecisionConfig or None, got {rule!r}")
    LINEAR_RULES[name] = rule


def declares_linear_rule(name: str) -> bool:
    """Whether the format ``name`` has stated its rule (None included)."""
    return name in LINEAR_RULES


def runs_in(config: PrecisionConfig) -> str | None:
    """What a Linear call of a run in ``config.dtype`` must run in (None: no rule, no call judged)."""
    if config.dtype not in LINEAR_RULES:
        raise ValueError(f"precision.dtype={config.dtype!r} states no rule for its Linear calls "
                         f"(stability.precision.rules.declare_linear_rule)")
    rule = LINEAR_RULES[config.dtype]
    return rule(config) if callable(rule) else rule
