"""What a baseline covers, and whether it covers what the current code judges.

    baseline["covers"] = covers(records, invariants)                         # by `stability baseline make`
    reasons = stale(baseline, job_cases, reported(records), invariants, judged)   # [] when it covers the job

A baseline states what the code that made it measured and judged:

* ``figures``: per case key, the judged figures its runs report (every arm's, together, a run that did not
  complete included: its evaluation figures are named although the check leaves their values out);
* ``invariants``: per case key, the names of the model invariants the suites evaluated there (null: the
  baseline was made without the suites, so it holds none);
* ``primary_family``: the rows of the merge check's primary family (``stability.record.figures``);
* ``resolutions``: per figure it holds, the kind of its resolution (``Figure.quantum``: "token", "step" ...).

A baseline is *stale* for a job when the job's code judges something it does not cover: a case, a figure
or an invariant the job recorded that the baseline lacks, another primary family, or another resolution
of a figure it holds. A stale baseline fails every job (exit 2, unchanged code included) with the one
command that fixes it: remaking the cases that lack data (``stability baseline make --cases``), or, for a
rule that changed (the primary family, a resolution), measuring the calibration again (``stability baseline
calibrate --write``, no training). So staleness shows in the pull request that caused it.

This module reads JSON only: no torch.
"""

from __future__ import annotations

from stability.record import case_key
from stability.record import figures as fig


def reported(records: list[dict]) -> dict[str, set[str]]:
    """Per case key, the judged figures the records' runs report (figures of extensions this process has not
    loaded left out: it cannot judge them)."""
    found: dict[str, set[str]] = {}
    for record in records:
        names = found.setdefault(case_key(record), set())
        for arm in record["arms"]:
            names.update(fig.judged([name for name in arm.get("final") or {} if fig.figure(name) is not None]))
    return found


def invariant_names(cases, invariants: list[dict] | None) -> dict[str, list[str]] | None:
    """Per case key of ``cases``, the names of the ``invariants`` recorded there (None: none were recorded)."""
    if invariants is None:
        return None
    return {key: sorted({line["name"] for line in invariants if line["case_key"] == key}) for key in sorted(cases)}


def covers(records: list[dict], invariants: list[dict] | None) -> dict:
    """What a baseline made of the regression ``records``, with the suites' ``invariants`` (None: no suites
    ran), covers, as the current code judges it."""
    figures = {key: sorted(names) for key, names in sorted(reported(records).items())}
    return {"figures": figures, "invariants": invariant_names(figures, invariants), **rules(figures)}


def rules(figures: dict[str, list[str]]) -> dict:
    """The rules of the current code that a calibration measures: the primary family, and the resolution
    kind of each figure of ``figures`` (case key -> names)."""
    names = sorted({name for per_case in figures.values() for name in per_case})
    return {"primary_family": fig.primary_family(),
            "resolutions": {name: (fig.figure(name).quantum if fig.figure(name) else None) for name in names}}


def merged(old: dict, new: dict, remade: set[str], cases: dict, invariants: list[dict] | None) -> dict:
    """The coverage of a baseline remade case by case: the figures of the case keys ``remade`` from ``new``'s
    coverage, the others' from ``old``'s; the invariants those the merged baseline holds (``cases``,
    ``invariants``); the rules ``new``'s (the calibration that follows measures them)."""
    old, new = old.get("covers") or {}, new.get("covers") or {}
    figures = {k: v for k, v in (old.get("figures") or {}).items() if k not in remade}
    figures.update({k: v for k, v in (new.get("figures") or {}).items() if k in remade})
    return {"figures": dict(sorted(figures.items())), "invariants": invariant_names(cases, invariants),
            **rules(figures)}


def remake_command(baseline: dict, stress: list[str] | None, path: str | None) -> str:
    """The command that remakes ``baseline`` (the stress cases ``stress`` only, or whole) at ``path``."""
    out = path or f"reports/baselines/{baseline['preset']}-{baseline['device']}.json"
    cases = f" --cases {','.join(sorted(stress))}" if stress else ""
    return f"stability baseline make --preset {baseline['preset']} --device {baseline['device']}{cases} --out {out}"


def stale(baseline: dict, job_cases: dict, job_figures: dict[str, set[str]], job_invariants: list[dict] | None,
          judged: set[str], path: str | None = None, chosen: list[str] | None = None) -> list[str]:
    """Why ``baseline`` does not cover the job ([] when it does): ``job_cases`` the job's runs
    (``case_values``), ``job_figures`` the figures they report (``reported``), ``job_invariants`` its
    suites' invariants (None: no suites ran), ``judged`` the case keys of the baseline being judged,
    ``chosen`` the stress cases of ``--cases`` (None: all; a case of the job outside them is left out on
    purpose); ``path`` the baseline's file, for the command. Each reason ends with the command that fixes it."""
    covered = baseline.get("covers")
    if not isinstance(covered, dict):
        return [(f"the baseline does not state what it covers (made by an older version of stability): remake "
                f"it: {remake_command(baseline, None, path)}")]
    base_cases = baseline["cases"]
    lacking: dict[str, list[str]] = {}   # stress case -> what its cases lack
    for key, case in sorted(job_cases.items()):
        base = base_cases.get(key)
        if base is None:
            chosen_out = chosen is not None and case["case"] not in chosen
            if not chosen_out and not any(c.get("name") == case["name"] for c in base_cases.values()):
                lacking.setdefault(case["case"], []).append(f"case {key} (not in the baseline)")
            continue
        if key not in judged:
            continue
        new = sorted(job_figures.get(key, set()) - set((covered.get("figures") or {}).get(key, [])))
        if new:
            lacking.setdefault(base["case"], []).append(f"case {key} figure(s) {', '.join(new)}")
    named = invariant_names(baseline["cases"], baseline.get("invariants"))   # what it holds, not what it says
    for key in sorted({line["case_key"] for line in job_invariants or []} & judged):
        now = sorted({line["name"] for line in job_invariants if line["case_key"] == key})
        before = set((named or {}).get(key, []))
        new = [name for name in now if name not in before]
        if new:
            what = "model invariants (the baseline was made without the suites)" if named is None \
                else f"model invariant(s) {', '.join(new)}"
            lacking.setdefault(base_cases[key]["case"], []).append(f"case {key} {what}")
    reasons = []
    if lacking:
        parts = "; ".join(part for stress in sorted(lacking) for part in lacking[stress])
        reasons.append(f"the baseline is stale: the code judges what it does not hold ({parts}): remake those cases: "
                       f"{remake_command(baseline, sorted(lacking), path)}")
    now = rules(covered.get("figures") or {})
    changed = [what for what, same in (
        ("the primary family", fig.same_family(covered.get("primary_family"), now["primary_family"])),
        ("the resolution of a figure", covered.get("resolutions") == now["resolutions"])) if not same]
    if changed:
        detail = family_diff(covered.get("primary_family") or [], now["primary_family"]) \
            if "the primary family" in changed else ""
        where = path or f"reports/baselines/{baseline['preset']}-{baseline['device']}.json"
        reasons.append(f"the baseline is stale: {' and '.join(changed)} changed since it was calibrated{detail}: "
                       f"measure its calibration again (no training): stability baseline calibrate --write {where}")
    return reasons


def family_diff(before: list[dict], now: list[dict]) -> str:
    """" (added: ...; removed: ...)" between two primary families, or ""."""
    def names(family):
        return {f"{row.get('case')}/{row.get('figure')}[{row.get('arms')}]" for row in family}
    added, removed = sorted(names(now) - names(before)), sorted(names(before) - names(now))
    parts = ([f"added {', '.join(added)}"] if added else []) + ([f"removed {', '.join(removed)}"] if removed else [])
    return f" ({'; '.join(parts)})" if parts else ""
