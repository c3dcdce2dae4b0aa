#!/usr/bin/env python3
"""An Nsight Systems export of N kernels, replicated from the real one of the corpus
(nsys-sqlite-h100/report1.sqlite: its schema, its other tables, its 19 kernel rows as templates).

Kernel i starts at 2 µs x i and lasts 1 µs (+ 50 ns x (i mod 7)), its columns copied from template
kernel i mod 19; each has one cudaLaunchKernel runtime call 0.9 µs before it (the same correlation
id). The rows are made by SQLite itself (a recursive counter), so a 5M-kernel file takes ~1 min.

    RANKSCOPE_CORPUS=/path/to/corpus python benchmarks/make_nsys_set.py OUT.sqlite 5000000
"""
from __future__ import annotations

import os
import shutil
import sqlite3
import sys
from pathlib import Path


def make_nsys_set(dest: str | Path, kernels: int, corpus: str | Path) -> Path:
    """Write the replica to `dest` (the corpus folder holds nsys-sqlite-h100/report1.sqlite)."""
    dest = Path(dest)
    shutil.copyfile(Path(corpus) / "nsys-sqlite-h100" / "report1.sqlite", dest)
    con = sqlite3.connect(dest)
    kernel_columns = [r[1] for r in con.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")]
    runtime_columns = [r[1] for r in con.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_RUNTIME)")]
    con.execute("CREATE TEMP TABLE template AS SELECT row_number() OVER () - 1 AS k, * FROM CUPTI_ACTIVITY_KIND_KERNEL")
    name_id, tid = con.execute("SELECT r.nameId, r.globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s "
                               "ON s.id = r.nameId WHERE s.value LIKE 'cudaLaunchKernel%' LIMIT 1").fetchone()
    t0 = con.execute("SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    templates = con.execute("SELECT count(*) FROM template").fetchone()[0]
    counter = f"WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i + 1 < {kernels})"
    con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL")
    own = {"start": f"{t0} + c.i * 2000", "end": f"{t0} + c.i * 2000 + 1000 + (c.i % 7) * 50",
           "correlationId": "1000000 + c.i"}
    con.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL {counter} SELECT "
                + ", ".join(own.get(c, f't."{c}"') for c in kernel_columns)
                + f" FROM c JOIN template t ON t.k = c.i % {templates}")
    launch = {"start": f"{t0} + c.i * 2000 - 900", "end": f"{t0} + c.i * 2000 - 880", "eventClass": "0",
              "globalTid": str(tid), "correlationId": "1000000 + c.i", "nameId": str(name_id), "returnValue": "0"}
    con.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME {counter} SELECT "
                + ", ".join(launch.get(c, "NULL") for c in runtime_columns) + " FROM c")
    con.commit()
    con.execute("VACUUM")
    con.close()
    return dest


def corpus_dir() -> Path:
    """$RANKSCOPE_CORPUS, else shared/corpus beside the repository's folder (as the tests read it)."""
    return Path(os.environ.get("RANKSCOPE_CORPUS") or Path(__file__).resolve().parents[2] / "shared" / "corpus")


if __name__ == "__main__":
    if len(sys.argv) != 3 or not sys.argv[2].isdigit():
        sys.exit("usage: python benchmarks/make_nsys_set.py OUT.sqlite KERNELS")
    make_nsys_set(sys.argv[1], int(sys.argv[2]), corpus_dir())
