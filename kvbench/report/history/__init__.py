"""asv's results across commits: each result file read and checked, shown beside its capture, charted as a page."""
