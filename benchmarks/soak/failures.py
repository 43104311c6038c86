"""Print what a rerun of a failed soak needs, from its JSON report: the seed, each target
missed, and the examples the report kept for them (``python -m benchmarks.soak.failures
build/soak-ci.json``). The CI log keeps these lines when the build directory is gone."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

#: The examples printed for each kind of failure (the report's ``examples`` keys).
EXAMPLES = (
    "lost_tasks",
    "overlaps_data_kept",
    "fencing_order_violations",
    "unreported_losses",
    "paused_holders_not_told",
    "mode_violations",
)


def lines(report: dict[str, Any]) -> list[str]:
    """The lines to print for ``report``."""
    config = report.get("config", {})
    out = [
        f"soak: rerun with --seed {config.get('seed')} --minutes {config.get('minutes')} "
        f"--lease {config.get('lease')}"
    ]
    out += [
        f"soak: missed: {row['name']}: {row['value']} (target {row['target']})"
        for row in report.get("targets", [])
        if not row.get("met")
    ]
    examples = report.get("examples", {})
    for name in EXAMPLES:
        out += [f"soak: {name}: {json.dumps(item, default=str)}" for item in examples.get(name, [])]
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m benchmarks.soak.failures REPORT.json", file=sys.stderr)
        return 2
    report = json.loads(Path(argv[0]).read_text())
    print("\n".join(lines(report)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
