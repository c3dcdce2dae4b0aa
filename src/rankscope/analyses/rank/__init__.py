"""Per-rank analyses (the map): (RankTrace, options) -> small typed results. Each runs on one
rank's frames in a worker; nothing here sees another rank."""
