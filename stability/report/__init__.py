"""Reading records for people (JSON only, no torch).

    html.py     the HTML / Markdown report with plots
    tables.py   the text tables the commands print
"""
