"""The report of one record: the model built from it, its sections as data, and each layout."""
