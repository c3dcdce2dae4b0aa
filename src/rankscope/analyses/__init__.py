"""Pure analysis functions: (RankTrace or summaries, options) -> frames/dataclasses.
No printing, no plotting, no file I/O. One module per question."""
