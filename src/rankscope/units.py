"""Units. Times inside rankscope are int64 nanoseconds; outputs are milliseconds (`_ms`) or
microseconds (`_us`), sizes bytes or MB (`_mb`, MiB), with the unit in the name."""

NS_PER_US = 1e3
NS_PER_MS = 1e6
BYTES_PER_MB = float(1 << 20)
