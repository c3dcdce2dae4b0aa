"""Views that scale (issue 32): the report of a large synthetic job with one injected straggler.

    python benchmarks/bench_scale_views.py --ranks 256 4096          # makes the jobs once (cached)
    python benchmarks/bench_scale_views.py --ranks 256 --keep /tmp/jobs

Per job (`rankscope synth DIR --ranks N --steps 3 --scale 0.1 --inject straggler:rank=77,...`, made
once into --keep and reused): the analysis time; the piped terminal report (80 columns): whether
every per-rank table shows the straggler, its widest line, whether any list of ranks is left
uncompressed; the HTML page: its size and the time headless Chromium takes from opening it to every
chart drawn (the median of --repeats loads); the swimlane's lane labels (the straggler's said).
"""
from __future__ import annotations

import argparse
import io
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rankscope.api import analyze
from rankscope.render.base import render
from rankscope.render.html import render_html
from rankscope.synth import generate_job, parse_injection

STRAGGLER = 77


class _Piped(Console):
    def __init__(self) -> None:
        super().__init__(width=80, file=io.StringIO(), color_system=None, record=True)
        self.tables: list[Table] = []

    def print(self, *objects, **options) -> None:
        self.tables += [o for o in objects if isinstance(o, Table)]
        super().print(*objects, **options)


def job(root: Path, ranks: int) -> Path:
    out = root / f"synth-{ranks}"
    if not (out / "ground_truth.json").exists():
        generate_job(out, ranks=ranks, steps=3, seed=0, scale=0.1,
                     injections=[parse_injection(f"straggler:rank={STRAGGLER},cause=host_idle,delay_ms=30")])
    return out


def browser_load_s(page_html: str, repeats: int) -> tuple[float, list[str]]:
    from playwright.sync_api import sync_playwright
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "report.html"
        path.write_text(page_html, encoding="utf-8")
        times, ticks = [], []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"))
            for _ in range(repeats):
                page = browser.new_page(viewport={"width": 1200, "height": 900})
                t0 = time.perf_counter()
                page.goto(path.as_uri())
                page.wait_for_function("Array.from(document.querySelectorAll('.chart')).every(d => "
                                       "d.querySelector('.main-svg'))", timeout=120_000)
                times.append(time.perf_counter() - t0)
                ticks = page.evaluate("Array.from(document.querySelectorAll('#chart-swimlane-0 .ytick text'))"
                                      ".map(t => t.textContent)")
                page.close()
            browser.close()
    return statistics.median(times), ticks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[256])
    ap.add_argument("--keep", type=Path, default=Path(tempfile.gettempdir()) / "rankscope-scale-views")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"{'ranks':>6} {'analyze s':>10} {'straggler in tables':>20} {'widest':>7} {'lists ok':>9} "
          f"{'html MB':>8} {'browser s':>10}  straggler lane")
    for n in args.ranks:
        folder = job(args.keep, n)
        t0 = time.perf_counter()
        a = analyze(folder, engine="local")
        t_analyze = time.perf_counter() - t0
        console = _Piped()
        render(a, "terminal", console)
        text = console.export_text()
        tables = [t for t in console.tables if t.columns and t.columns[0].header == "rank"]
        named = sum(str(STRAGGLER) in t.columns[0].cells for t in tables)
        widest = max(len(line) for line in text.splitlines())
        lists_ok = not re.search(r"(\d+, ){8}", text)
        page = render_html(a)
        load_s, ticks = browser_load_s(page, args.repeats)
        lane = next((t for t in ticks if t.startswith(f"rank {STRAGGLER}")), "-")
        print(f"{n:>6} {t_analyze:>10.1f} {f'{named}/{len(tables)}':>20} {widest:>7} {str(lists_ok):>9} "
              f"{len(page) / 1e6:>8.1f} {load_s:>10.2f}  {lane}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
