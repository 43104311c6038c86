"""The limit gauges of :mod:`celery_singleton_lock.metrics`: a collector that reads the
stacked limits from the lock Redis at each scrape."""

from __future__ import annotations

import math
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from celery_singleton_lock._metrics.objects import LIMIT_GAUGES, LIMIT_SERIES, PREFIX, log
from celery_singleton_lock.client import redis_for
from celery_singleton_lock.config import settings_for
from celery_singleton_lock.ops.limits import LimitRow, code_limits, read_limits


class LimitsCollector(Collector):
    """The limit gauges of ``app``, read from its lock Redis when scraped (one ``HGETALL``,
    a ``SCAN`` of the app's limit keys and one pipelined read; see ``celery locks limit
    list``, which shows the same). A Redis error is logged and the gauges are left out of
    that scrape."""

    def __init__(self, app: Any, most: int = LIMIT_SERIES) -> None:
        self.app = app
        self.most = most

    def describe(self) -> list[Any]:
        return [GaugeMetricFamily(f"{PREFIX}_{name}", text) for name, text in LIMIT_GAUGES]

    def collect(self) -> list[Any]:
        try:
            rows = limit_rows(self.app)
        except Exception as exc:  # noqa: BLE001 - a scrape never fails for the locks
            log.warning("singleton lock metrics: could not read the stacked limits: %s", exc)
            return []
        families = [
            GaugeMetricFamily(f"{PREFIX}_{name}", text, labels=["limit"])
            for name, text in LIMIT_GAUGES
        ]
        live = [row for row in rows if row.in_use is not None]
        live.sort(key=lambda row: (-(row.in_use or 0), row.name))
        for row in live[: self.most]:
            number = min(row.applies, default=None)
            values = (row.in_use, row.holds, number)
            for family, value in zip(families, values, strict=True):
                if value is not None and value != math.inf:
                    family.add_metric([row.name], float(value))
        return families


def limit_rows(app: Any) -> list[LimitRow]:
    """The stacked limits of ``app`` as ``celery locks limit list`` reads them."""
    settings = settings_for(app)
    client = redis_for(app, settings.url)
    return read_limits(client, settings.prefix, code_limits(app))
