"""Types of the C pickle pre-scan (_picklescan.c); rankscope.ingest.safe_pickle wraps it."""
from _typeshed import ReadableBuffer


def hash_work(data: ReadableBuffer, limit: int, table: list[tuple[int, int, int, int, int]], /) -> int: ...
