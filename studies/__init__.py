"""Studies: searches for where the gate's effect shows, whose findings the reports and presets quote.

Run each script as a module from the repository root (``python -m studies.find_effects --help``):

    find_effects.py      regimes where the gated and baseline arms differ (reports/effects.md, controls.md)
    sink_search.py       where an attention sink forms on the CPU (reports/sink.md, sink.png)
    compare_families.py  the gate's effect in the llama and gpt2 families (reports/families.md)

Nothing here is asserted; the claims they found are tested in suites/test_claims.py.
"""
