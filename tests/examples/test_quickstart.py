"""The README's quick start as a script: ``python -m examples.quickstart`` runs the README's
task module on a real worker and checks "six calls sell three" in code."""

from __future__ import annotations

import re

import pytest

from tests.examples.conftest import ROOT, run_example


def _readme_block() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"## Quick start\n.*?```python\n(.*?)```", readme, re.S)
    assert found is not None, "the README has no quick start block"
    return found.group(1)


def test_the_readme_shows_the_example_s_task_module_and_its_command() -> None:
    """The README's quick start block is ``examples/quickstart/shop.py`` as it is, and the
    README gives the command that runs it."""
    shop = (ROOT / "examples" / "quickstart" / "shop.py").read_text(encoding="utf-8")
    assert _readme_block() == shop
    assert "python -m examples.quickstart" in (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.slow
def test_six_calls_sell_three_on_a_real_worker() -> None:
    """The script starts its own redis-server and worker, sends six purchases of a stock of
    three, and exits 0 after checking that exactly three sold, each with its own fencing
    token, and the stock is 0; everything it started is stopped."""
    done = run_example("examples.quickstart", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    fences = re.findall(r"buyer \d: sold, fence (\d+)", done.stdout)
    assert len(fences) == 3
    assert len(set(fences)) == 3
    assert done.stdout.count("sold out") == 3
    assert "6 calls sold 3: no oversell" in done.stdout
    assert "FAILED" not in done.stdout
    started = re.findall(r"^started (\S+) pid (\d+)", done.stdout, re.M)
    stopped = re.findall(r"^stopped (\S+) pid (\d+)", done.stdout, re.M)
    assert started
    assert sorted(started) == sorted(stopped)
