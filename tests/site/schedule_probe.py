"""Tasks for tests/site/test_schedule.py: module-level, so that a worker process of site_scripts/schedule.py can
import them. Each records when it ran, as seconds on the machine's monotonic clock, in <folder>/<name>.json."""

import json
import time
from pathlib import Path


def record(folder, name, seconds=0.4, fail=False):
    start = time.monotonic()
    time.sleep(seconds)
    if fail:
        raise RuntimeError(f"task {name} failed on purpose")
    Path(folder, f"{name}.json").write_text(json.dumps([start, time.monotonic()]))
