"""Cross-rank analyses (the reduce): over the ranks' small per-rank results, never their event
frames: collectives matched across ranks, clock alignment, stragglers, alpha-beta fits, MFU, the
A/B diff of two jobs."""
