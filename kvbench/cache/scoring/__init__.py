"""The score-based evicting kinds, one file each (kvbench.cache.scored does the when, how much and what; each
kind here is its score, as NVIDIA kvpress 0.5.5 defines it). kvbench.modes registers each by its cache class."""
