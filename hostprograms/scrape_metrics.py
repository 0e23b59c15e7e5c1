"""Host side of a benchmark run's exact acceptance: one scrape of the server's Prometheus `/metrics`.

Runs on the GPU host (stdlib only, MIN_PYTHON) before and after each run of the serving benchmark (steps/benchmark.py
`metered`). Its config: base_url (`$vars` expand here, as in a path), families (the metric names to keep,
steps/server_metrics.py FAMILIES), timeout_s. The document is kit.scrape_metrics's: status, error, lines.
Exit status 0 whatever the server answered: a server without metrics (404) is a fact, not a failure.
"""

from __future__ import annotations

from typing import Any

from hostprograms import kit

MIN_PYTHON = (3, 7)


def scrape(config: dict[str, Any]) -> dict[str, Any]:
    return kit.scrape_metrics(kit.expand_path(config["base_url"]), config["families"], float(config["timeout_s"]))


def main() -> int:
    return kit.main(scrape)
