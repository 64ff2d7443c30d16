"""Everything kvbench shows is generated from records: tables, reports, plots, comparisons.

Modules, bottom up: ``format`` (numbers, bytes, checks, escaping), ``model`` (the rows
and the report built from a record), ``columns`` (the tables' columns), ``compare``
(two records side by side), then one module per layout: ``terminal``, ``markdown``,
``html``, ``plots``; ``asvfile`` reads asv's result files as records are read (every field checked),
``asvresult`` shows one beside its capture, ``history`` and ``historypage`` chart them across commits.
"""
