"""A self-contained HTML report (plots embedded as base64 PNG data URIs) plus a Markdown twin.

For each record (stress case): loss and grad-norm curves of every arm on one figure,
LR-sweep curves when the record holds several peak learning rates, F-Attn and M-Act per
layer, per-scheme quantization damage and the length-extrapolation curves when present; the
per-arm table (one row per arm: means over seeds) and the paired table (each arm against the
reference arm); the precision ladder and the quantization table with the library, version and recipe of
each row; the regression verdicts when a baseline is given; the environment; the MLflow run ids.

    stability report [RUN_DIR | records...] --out reports/report.html [--baseline reports/baselines/smoke-cpu.json]

Plots are drawn with matplotlib's Agg canvas on ``Figure`` objects (no pyplot global state).
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
from pathlib import Path

from stability.config.schedules import Standard
from stability.record import REFERENCE_ARM, Status, case_key, declared_case, usable_value
from stability.record import figures as fig
from stability.record.machine import machine_key
from stability.report.tables import fmt, markdown_text, quant_rows, side_means

ARM_COLORS = {REFERENCE_ARM: "#1f77b4", "gated": "#d62728"}
OTHER_COLORS = ("#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
SEED_STYLES = ("-", "--", ":", "-.")


def arm_color(name: str, record: dict) -> str:
    """Baseline blue, gated red, the other arms of the record in a fixed order of distinct colours."""
    if name in ARM_COLORS:
        return ARM_COLORS[name]
    others = [n for n in dict.fromkeys(a["arm"] for a in record.get("arms") or []) if n not in ARM_COLORS]
    index = others.index(name) if name in others else len(others)
    return OTHER_COLORS[index % len(OTHER_COLORS)]


# ----------------------------------------------------------------------------- figures from a record

def _finite(values) -> list:
    return [v if isinstance(v, (int, float)) and v is not None and math.isfinite(v) else float("nan")
            for v in values]


def _lr_varies(record: dict) -> bool:
    """True when an arm's LR spans more than a factor 10 (an LR range test / ramp): loss vs LR is worth a plot."""
    for arm in record.get("arms") or []:
        lrs = [v for v in (arm.get("series") or {}).get("lr") or [] if isinstance(v, (int, float)) and v > 0]
        if lrs and max(lrs) / min(lrs) > 10 and record.get("case_label") != Standard.name:
            return True
    return False


def new_figure(width=8.0, height=3.2, ncols=2):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=90)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols) if ncols > 1 else [fig.subplots(1, 1)]
    return fig, axes


def png_bytes(fig) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _arm_label(arm: dict) -> str:
    variant = f" ({arm.get('variant')})" if arm.get("variant") not in (None, arm["arm"]) else ""
    return f"{arm['arm']}{variant} seed {arm.get('seed')}"


def plot_curves(record: dict) -> bytes:
    """Training loss and global grad norm per step, every arm (and all seeds) on one figure."""
    fig, (ax_loss, ax_grad) = new_figure()
    seeds = sorted({a.get("seed") for a in record["arms"]}, key=str)
    for arm in record["arms"]:
        series = arm.get("series") or {}
        style = SEED_STYLES[seeds.index(arm.get("seed")) % len(SEED_STYLES)]
        color = arm_color(arm["arm"], record)
        steps = series.get("step") or []
        ax_loss.plot(steps, _finite(series.get("loss") or []), style, color=color, lw=1, label=_arm_label(arm))
        ax_grad.plot(steps, _finite(series.get("grad_norm") or []), style, color=color, lw=1)
        if arm.get("diverged_at_step") is not None:
            ax_loss.axvline(arm["diverged_at_step"], color=color, lw=0.8, alpha=0.6)
    ax_loss.set(title="training loss", xlabel="step", ylabel="loss (nats/token)")
    ax_grad.set(title="gradient norm (before clipping)", xlabel="step", ylabel="global L2 norm")
    if any(v > 0 for a in record["arms"] for v in _finite((a.get("series") or {}).get("grad_norm") or [])
           if math.isfinite(v)):
        ax_grad.set_yscale("log")
    ax_loss.legend(fontsize=7)
    return png_bytes(fig)


def plot_loss_vs_lr(record: dict) -> bytes:
    """Loss against the learning rate of each step (an LR range test), every arm."""
    fig, (ax,) = new_figure(5.5, 3.4, 1)
    seeds = sorted({a.get("seed") for a in record["arms"]}, key=str)
    for arm in record["arms"]:
        series = arm.get("series") or {}
        style = SEED_STYLES[seeds.index(arm.get("seed")) % len(SEED_STYLES)]
        ax.plot(_finite(series.get("lr") or []), _finite(series.get("loss") or []), style,
                color=arm_color(arm["arm"], record), lw=1, label=_arm_label(arm))
    ax.set_xscale("log")
    ax.set(title="loss vs learning rate (per step)", xlabel="learning rate", ylabel="loss")
    ax.legend(fontsize=7)
    return png_bytes(fig)


def _layer_figures(record: dict, key: str) -> dict[str, list[float]]:
    """Per arm, the mean over seeds of the last probe snapshot's per-layer ``key``."""
    per_arm: dict[str, list[list[float]]] = {}
    for arm in record["arms"]:
        probes = arm.get("probes") or []
        if not probes:
            continue
        layers = probes[-1].get("layers") or []
        per_arm.setdefault(arm["arm"], []).append(_finite([layer.get(key) for layer in layers]))
    out = {}
    for arm, rows in per_arm.items():
        width = max(len(r) for r in rows)
        out[arm] = [_nanmean([r[i] for r in rows if i < len(r)]) for i in range(width)]
    return out


def _nanmean(values) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else float("nan")


def plot_layers(record: dict) -> bytes | None:
    """F-Attn (first-token attention share) and M-Act (max |activation|) per layer, every arm."""
    f_attn, m_act = _layer_figures(record, "f_attn"), _layer_figures(record, "m_act")
    if not f_attn and not m_act:
        return None
    fig, (ax_f, ax_m) = new_figure()
    for ax, data, title in ((ax_f, f_attn, "F-Attn per layer (attention on token 0)"),
                            (ax_m, m_act, "M-Act per layer (max |residual|)")):
        arms = sorted(data)
        width = 0.8 / max(1, len(arms))
        for i, arm in enumerate(arms):
            xs = [layer + (i - (len(arms) - 1) / 2) * width for layer in range(len(data[arm]))]
            ax.bar(xs, data[arm], width=width, color=arm_color(arm, record), label=arm)
        ax.set_xticks(range(max((len(v) for v in data.values()), default=0)))
        ax.set(title=title, xlabel="layer")
        ax.legend(fontsize=7)
    return png_bytes(fig)


def quant_damage(record: dict) -> dict[str, dict[str, float]]:
    """{scheme: {arm: damage}}: held-out loss after quantization minus full precision, mean over seeds, from
    the arms' ``quant["schemes"]`` (stability.evaluate.quantize); skipped schemes are left out."""
    out: dict[str, dict[str, list[float]]] = {}
    for arm in record["arms"]:
        for scheme, entry in ((arm.get("quant") or {}).get("schemes") or {}).items():
            value = entry.get("damage_loss") if isinstance(entry, dict) and not entry.get("skipped") else None
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                out.setdefault(scheme, {}).setdefault(arm["arm"], []).append(float(value))
    return {s: {a: sum(v) / len(v) for a, v in arms.items()} for s, arms in out.items()}


def quant_skipped(record: dict) -> dict[str, str]:
    return {scheme: str(entry["skipped"]) for arm in record["arms"]
            for scheme, entry in ((arm.get("quant") or {}).get("schemes") or {}).items()
            if isinstance(entry, dict) and entry.get("skipped")}


def plot_quant(record: dict) -> bytes | None:
    damage = quant_damage(record)
    if not damage:
        return None
    fig, (ax,) = new_figure(5.5, 3.2, 1)
    schemes = sorted(damage)
    arms = sorted({a for d in damage.values() for a in d})
    width = 0.8 / max(1, len(arms))
    for i, arm in enumerate(arms):
        xs = [j + (i - (len(arms) - 1) / 2) * width for j in range(len(schemes))]
        ax.bar(xs, [damage[s].get(arm, float("nan")) for s in schemes], width=width, color=arm_color(arm, record),
               label=arm)
    ax.set_xticks(range(len(schemes)), schemes, rotation=20, fontsize=8)
    ax.axhline(0, color="black", lw=0.6)
    ax.set(title="post-quantization damage (held-out loss increase)", ylabel="loss after - before")
    ax.legend(fontsize=7)
    return png_bytes(fig)


def extrapolation_curves(record: dict) -> dict[str, dict[str, list[tuple[float, float, float, float]]]]:
    """{arm: {rope: [(factor, held-out loss, F-Attn, sink rate), ...]}}, means over seeds (completed arms),
    from the arms' ``extrapolation`` points (stability.evaluate.extrapolation); the NTK curve starts at plain 1x."""
    sums: dict[tuple[str, str, float], list[list[float]]] = {}
    for arm in record.get("arms") or []:
        if arm.get("status") != Status.COMPLETED:
            continue
        points = (arm.get("extrapolation") or {}).get("points") or []
        ropes = {p["rope"] for p in points}
        for point in points:
            for rope in (ropes if point["factor"] == 1.0 and point["rope"] == "plain" else {point["rope"]}):
                sums.setdefault((arm["arm"], rope, point["factor"]), []).append(
                    [point.get("heldout_loss"), point.get("f_attn"), point.get("sink_rate")])
    out: dict[str, dict[str, list]] = {}
    for (arm, rope, factor), rows in sorted(sums.items(), key=lambda item: item[0][2]):
        means = [_nanmean(_finite([row[i] for row in rows])) for i in range(3)]
        out.setdefault(arm, {}).setdefault(rope, []).append((factor, *means))
    return out


def plot_extrapolation(record: dict) -> bytes | None:
    """Held-out loss and F-Attn against the evaluation length (multiples of the training context), every
    arm; plain RoPE solid, NTK-aware scaled RoPE dashed."""
    curves = extrapolation_curves(record)
    if not curves:
        return None
    fig, (ax_loss, ax_f) = new_figure()
    for arm, by_rope in curves.items():
        for rope, points in sorted(by_rope.items(), key=lambda item: item[0] != "plain"):
            factors = [p[0] for p in points]
            style = "o-" if rope == "plain" else "s--"
            ax_loss.plot(factors, [p[1] for p in points], style, color=arm_color(arm, record), lw=1, ms=4,
                         label=f"{arm} {rope}")
            ax_f.plot(factors, [p[2] for p in points], style, color=arm_color(arm, record), lw=1, ms=4)
    for ax in (ax_loss, ax_f):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("length / training context")
    ax_loss.set(title="held-out loss beyond the training context", ylabel="loss (nats/token)")
    ax_f.set(title="F-Attn beyond the training context", ylabel="attention on token 0")
    ax_loss.legend(fontsize=6)
    return png_bytes(fig)


def make_plots(record: dict) -> dict[str, bytes]:
    """{name: PNG bytes}: curves, the plots the record's case declares (``stability.record.declared_case``: the
    sweep's loss against its peak LRs), else the loss against the LR where it spans a factor 10 (a range
    test), layers (probes), quant and extrapolation (when present)."""
    plots = {"curves": plot_curves(record)}
    for plot in declared_case(record).plots:   # the plots only the record's case makes (its StressCase's plots)
        png = plot.png(record)
        if png:
            plots[plot.name] = png
    if len(plots) == 1 and _lr_varies(record):
        plots["lr"] = plot_loss_vs_lr(record)
    for name, fn in (("layers", plot_layers), ("quant", plot_quant), ("extrapolation", plot_extrapolation)):
        png = fn(record)
        if png:
            plots[name] = png
    return plots


PLOT_TITLES = {"curves": "Loss and gradient norm, every arm", "lr": "Learning rates: loss against the LR",
               "layers": "F-Attn and M-Act per layer", "quant": "Post-training quantization damage",
               "extrapolation": "Length extrapolation: held-out loss and F-Attn beyond the training context"}


# ----------------------------------------------------------------------------- tables


def summary_rows(record: dict) -> list[list[str]]:
    """Per treatment arm and figure: arm - reference over seeds (means, difference, 95% CI, p, n), with the
    figure's direction and unit from the figure table."""
    rows = [["arm", "figure", "better", "unit", "reference", "arm value", "arm-reference", "95% CI", "p", "n"]]
    for arm, table in (record.get("paired") or {}).items():
        for figure, s in table.items():
            entry = fig.figure(figure)
            ci = f"[{fmt(s.get('ci_low'))}, {fmt(s.get('ci_high'))}]" if s.get("ci_low") is not None else "-"
            reference, treatment = side_means(record, arm, figure, s)
            rows.append([arm, figure, str(s.get("better") or "-"), entry.unit if entry else "", fmt(reference),
                         fmt(treatment), fmt(s.get("difference")), ci, fmt(s.get("p_value")),
                         fmt(s.get("n"))])
    for scheme, reason in quant_skipped(record).items():
        rows.append(["all", f"quant {scheme}", "-", "", "skipped", "skipped", "-", reason, "-", "-"])
    return rows


def per_arm_rows(record: dict) -> list[list[str]]:
    """One row per arm (the reference arm first): its variant, seeds, statuses and the mean over seeds of the headline
    figures of the figure table that its arms have (evaluation figures over completed seeds only)."""
    arms = record.get("arms") or []
    names = list(dict.fromkeys(a["arm"] for a in sorted(arms, key=lambda a: a["arm"] != REFERENCE_ARM)))
    figures = fig.headline(name for a in arms for name in (a.get("final") or {}))
    rows = [["arm", "variant", "seeds", "completed", "diverged"] + figures]
    for name in names:
        mine = [a for a in arms if a["arm"] == name]
        cells = [name, str(mine[0].get("variant")), str(len(mine)),
                 str(sum(a.get("status") == Status.COMPLETED for a in mine)),
                 str(sum(a.get("status") == Status.DIVERGED for a in mine))]
        for figure in figures:
            values = [v for v in (usable_value(a, figure) for a in mine) if v is not None]
            cells.append(fmt(sum(values) / len(values)) if values else "-")
        rows.append(cells)
    return rows


def arm_rows(record: dict) -> list[list[str]]:
    rows = [["arm", "variant", "seed", "status", "diverged at", "steps", "wall s", "tokens/s", "stop reason"]]
    for arm in record.get("arms") or []:
        timing = arm.get("timing") or {}
        rows.append([arm["arm"], str(arm.get("variant")), str(arm.get("seed")), str(arm.get("status")),
                     fmt(arm.get("diverged_at_step")), fmt((arm.get("final") or {}).get("steps_completed")),
                     fmt(timing.get("wall_seconds")), fmt(timing.get("tokens_per_second")),
                     str(arm.get("stop_reason") or "")])
    return rows


def env_rows(record: dict) -> list[list[str]]:
    rows = [["key", "value"]]
    for key, value in (record.get("git") or {}).items():
        rows.append([f"git.{key}", fmt(value)])
    for key, value in (record.get("env") or {}).items():
        if key == "machine" and isinstance(value, dict):   # its key, then what the key leaves out
            rows += [["machine", machine_key(value)], ["machine.isa", ", ".join(value.get("isa") or []) or "-"],
                     ["machine.torch", ", ".join(f"{k} {fmt(v)}" for k, v in (value.get("torch") or {}).items())]]
        else:
            rows.append([key, fmt(value)])
    return rows


def tracking_rows(record: dict) -> list[list[str]]:
    tracking = record.get("tracking") or {}
    if not tracking:
        return [["mlflow", "not logged (no tracking entry in the record)"]]
    rows = [["mlflow", str(tracking.get("status"))], ["tracking uri", str(tracking.get("uri"))]]
    if tracking.get("status") == "tracked":
        rows += [["experiment", f"{tracking.get('experiment')} (id {tracking.get('experiment_id')})"],
                 ["parent run", str(tracking.get("parent_run_id"))]]
        rows += [[f"run {name}", str(run_id)] for name, run_id in (tracking.get("child_run_ids") or {}).items()]
    elif tracking.get("error"):
        rows.append(["error", str(tracking["error"])])
    return rows


def _html_table(rows: list[list[str]], cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows[1:])
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _md_table(rows: list[list[str]]) -> str:
    """A Markdown table, every cell escaped (``markdown_text``: a cell stays one cell on one line)."""
    lines = ["| " + " | ".join(markdown_text(c) for c in rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(markdown_text(c) for c in row) + " |" for row in rows[1:]]
    return "\n".join(lines)


def _verdict_rows(result, rows=None) -> list[list[str]]:
    return [result.HEADER] + [result.cells(row) for row in (result.rows if rows is None else rows)]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "record"


# ----------------------------------------------------------------------------- documents

CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:0.6em 0 1.2em;font-size:13px}th,td{border:1px solid #ccc;padding:3px 7px;
text-align:left}th{background:#f2f2f2}img{max-width:100%;border:1px solid #eee;margin:4px 0}
.regressed{color:#b00;font-weight:bold}.ok{color:#070}.case{border-top:2px solid #888;margin-top:2em}"""


def render(records: list[dict], result=None, plots: list[dict[str, bytes]] | None = None,
           image_paths: list[dict[str, str]] | None = None) -> tuple[str, str]:
    """(HTML, Markdown) of the report; ``plots`` per record (made here when not given), ``image_paths`` the
    Markdown's relative PNG paths per record."""
    plots = plots if plots is not None else [make_plots(r) for r in records]
    title = "Stability report"
    h = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title><style>{CSS}</style></head><body>",
         f"<h1>{title}</h1>", f"<p>{len(records)} record(s): "
         + ", ".join(html.escape(case_key(r)) for r in records) + "</p>"]
    m = [f"# {title}", "", f"{len(records)} record(s): "
         + ", ".join(markdown_text(case_key(r)) for r in records), ""]
    if result is not None:
        cls = {0: "ok", 1: "regressed", 2: "regressed", 3: "regressed"}[result.exit_code]
        h += ["<h2 id='regression'>Regression check</h2>",
              f"<p class='{cls}'>{html.escape(result.summary_line())}</p>"]
        h += [f"<p>{html.escape(result.method())}</p>"]
        h += [f"<p class='regressed'>{html.escape(line)}</p>" for line in result.failure_lines()]
        h += [f"<p>warning: {html.escape(w)}</p>" for w in result.warnings]
        h += [f"<p>note: {html.escape(n)}</p>" for n in result.notes]
        shown = result.shown(only_changed=True)
        if shown:
            h += ["<h3>The primary family, and the advisory rows that moved</h3>",
                  _html_table(_verdict_rows(result, shown), "changed")]
        if result.rows:
            h += [f"<details><summary>all {len(result.rows)} figures</summary>",
                  _html_table(_verdict_rows(result), "verdicts"), "</details>"]
        m += ["## Regression check", "", result.markdown(), ""]
    for index, record in enumerate(records):
        case = case_key(record)
        h += [(f"<div class='case'><h2>{html.escape(case)} <small>({html.escape(str(record.get('preset')))}, "
               f"status {html.escape(str(record.get('status')))}, id {html.escape(str(record.get('id')))})"
               "</small></h2>"),
              f"<p>{html.escape(str(record.get('description') or ''))}</p>"]
        m += [f"## {markdown_text(case)}", "",
              markdown_text(f"Preset {record.get('preset')}, status {record.get('status')}, id {record.get('id')}. "
                            f"{record.get('description') or ''}"), ""]
        titles = {**PLOT_TITLES, **{plot.name: plot.title for plot in declared_case(record).plots}}
        for name, png in plots[index].items():
            data = base64.b64encode(png).decode("ascii")
            label = titles.get(name, name)
            h += [f"<h3>{html.escape(label)}</h3>",
                  (f"<img class='plot' id='plot-{index}-{name}' alt='{html.escape(label)}' "
                   f"src='data:image/png;base64,{data}'>")]
            if image_paths:
                m += [f"### {label}", "", f"![{label}]({image_paths[index][name]})", ""]
        own = [(table.title, table.rows(record), table.name) for table in declared_case(record).tables]
        sections = (("Per arm (means over seeds)", per_arm_rows(record), "per-arm"),
                    ("Paired figures: each arm against the reference arm (means over seeds)", summary_rows(record),
                     "summary"),
                    *[(title, rows, cls) for title, rows, cls in own if len(rows) > 1],  # the case's own tables
                    ("Post-training quantization: each scheme's library, recipe and damage", quant_rows(record),
                     "quant"),
                    ("Runs: one per arm and seed", arm_rows(record), "arms"), ("Environment", env_rows(record), "env"),
                    ("MLflow", tracking_rows(record), "tracking"))
        for heading, rows, cls in sections:
            if len(rows) < 2 and cls == "quant":  # no scheme ran
                continue
            h += [f"<h3>{heading}</h3>", _html_table(rows, cls)]
            m += [f"### {heading}", "", _md_table(rows), ""]
        h.append("</div>")
    # marks each figure once the browser has decoded it (headless-browser checks read data-loaded)
    h.append("<script>window.addEventListener('load',function(){var n=0;document.querySelectorAll('img.plot')"
             ".forEach(function(i){var ok=i.complete&&i.naturalWidth>0;i.dataset.loaded=ok;if(ok)n++;});"
             "document.body.dataset.plotsLoaded=n;});</script>")
    h.append("</body></html>")
    return "\n".join(h), "\n".join(m) + "\n"


def write_report(records: list[dict], out: str | Path = "reports/report.html", result=None) -> dict:
    """Write ``out`` (HTML, self-contained), its Markdown twin (``.md``) and the PNGs the Markdown links
    (``<stem>_plots/``). Returns {"html", "markdown", "plots": [paths]}."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot_dir = out.parent / f"{out.stem}_plots"
    plot_dir.mkdir(exist_ok=True)
    plots = [make_plots(r) for r in records]
    image_paths, written = [], []
    for index, (record, record_plots) in enumerate(zip(records, plots)):
        names = {}
        for name, png in record_plots.items():
            path = plot_dir / f"{index:02d}-{_slug(str(record.get('name')))}-{_slug(str(record.get('case_label')))}-" \
                              f"{name}.png"
            path.write_bytes(png)
            written.append(path)
            names[name] = f"{plot_dir.name}/{path.name}"
        image_paths.append(names)
    text_html, text_md = render(records, result, plots, image_paths)
    out.write_text(text_html)
    md = out.with_suffix(".md")
    md.write_text(text_md)
    return {"html": out, "markdown": md, "plots": written}
