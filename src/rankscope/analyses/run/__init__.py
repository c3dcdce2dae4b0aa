"""Whole runs (docs/runs.md): what a run keeps of each analysed profiler cycle and the run view built
from them (cycles.py), the changes over the run (changes.py). Inputs are the per-cycle job analyses'
small results, never events."""
