"""Everything kvbench shows is generated from records: tables, reports, plots, comparisons.

One subpackage per product, over ``format`` (numbers, bytes, checks, escaping, markdown
tables, consoles), which every product shares:

- ``record``: the report of one run: its model, its sections as data, and one module per
  layout (``terminal``, ``markdown``, ``html``, ``plots``); a serving record's tables too.
- ``comparison``: two records side by side (``compare``), their environments' differences,
  the machine probe, several machines at once, and the comparison's layouts.
- ``history``: asv's result files read as records are read (``asvfile``), one shown beside
  its capture (``asvresult``), and charted across commits (``charts``, ``page``).
"""
