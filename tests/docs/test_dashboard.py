"""The Grafana dashboard of ``examples/grafana`` queries only metrics that
``celery_singleton_lock.metrics`` exposes, with their labels, and charts every one of them
(the stacked limits' gauges, read from the lock Redis at each scrape, included).

Each PromQL expression of the dashboard (its panels' queries and its variables'
``label_values``) is read into the series it selects: a metric name with its label matchers,
and the labels it groups by. Those are compared with every series ``metrics.exposed()``
lists, as Prometheus exposes them (a counter ``x`` as ``x_total``; a histogram ``x`` as
``x_bucket`` with ``le``, ``x_sum`` and ``x_count``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from celery_singleton_lock import metrics
from celery_singleton_lock.metrics import PREFIX

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "examples" / "grafana" / "dashboards").glob("*.json"))

#: PromQL's functions and aggregation operators (a name followed by its arguments).
FUNCTIONS = frozenset((
    "abs", "absent", "absent_over_time", "avg", "avg_over_time", "bottomk", "ceil", "changes",
    "clamp", "clamp_max", "clamp_min", "count", "count_over_time", "count_values",
    "day_of_month", "day_of_week", "day_of_year", "days_in_month", "delta", "deriv", "exp",
    "floor", "group", "histogram_avg", "histogram_count", "histogram_fraction",
    "histogram_quantile", "histogram_stddev", "histogram_stdvar", "histogram_sum",
    "holt_winters", "hour", "idelta", "increase", "irate", "label_join", "label_replace",
    "last_over_time", "ln", "log10", "log2", "max", "max_over_time", "min", "min_over_time",
    "minute", "month", "predict_linear", "present_over_time", "quantile", "quantile_over_time",
    "rate", "resets", "round", "scalar", "sgn", "sort", "sort_desc", "sqrt", "stddev",
    "stddev_over_time", "stdvar", "stdvar_over_time", "sum", "sum_over_time", "time",
    "timestamp", "topk", "vector", "year",
))  # fmt: skip
#: Keywords followed by a list of label names.
GROUPING = frozenset(("by", "without", "on", "ignoring", "group_left", "group_right"))
#: Other keywords.
KEYWORDS = frozenset(("bool", "and", "or", "unless", "offset", "atan2"))

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<matchers>\{[^}]*\})
      | (?P<range>\[[^\]]*\])
      | (?P<name>[A-Za-z_:][A-Za-z0-9_:]*)
      | (?P<number>\d+(?:\.\d*)?(?:e[+-]?\d+)?)
      | (?P<punct>[(),])
      | (?P<operator>[-+*/%^]|==|!=|>=|<=|>|<)
    )""",
    re.VERBOSE,
)
_MATCHER = re.compile(r"""\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?""")


@dataclass
class Selector:
    """One series selector of an expression: a metric name (None for ``{...}`` alone) and
    its matchers as ``(label, operator, value)``."""

    metric: str | None
    matchers: list[tuple[str, str, str]] = field(default_factory=list)


@dataclass
class Query:
    """What one PromQL expression reads: its selectors and the labels it groups by."""

    expr: str
    selectors: list[Selector] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)


def tokens(expr: str) -> list[tuple[str, str]]:
    """``expr`` as ``(kind, text)`` tokens; ``ValueError`` on anything PromQL cannot hold."""
    found, at = [], 0
    expr = expr.rstrip()
    while at < len(expr):
        match = _TOKEN.match(expr, at)
        if match is None or match.end() == at:
            raise ValueError(f"cannot read {expr[at:]!r} in {expr!r}")
        kind = match.lastgroup
        assert kind is not None
        found.append((kind, match.group(kind)))
        at = match.end()
    return found


def matchers(block: str) -> list[tuple[str, str, str]]:
    """The ``label op "value"`` matchers of a ``{...}`` block."""
    inner, found = block[1:-1].strip(), []
    at = 0
    while at < len(inner):
        match = _MATCHER.match(inner, at)
        if match is None:
            raise ValueError(f"cannot read the matchers {block!r}")
        found.append((match.group(1), match.group(2), match.group(3)))
        at = match.end()
    return found


def parse(expr: str) -> Query:
    """The selectors and grouping labels of the PromQL expression ``expr``."""
    query = Query(expr)
    items = tokens(expr)
    index = 0
    while index < len(items):
        kind, text = items[index]
        following = items[index + 1] if index + 1 < len(items) else ("", "")
        if kind == "name" and text in GROUPING:
            if following == ("punct", "("):
                end = items.index(("punct", ")"), index + 2)
                query.grouping |= {name for k, name in items[index + 2 : end] if k == "name"}
                index = end
        elif kind == "name" and text in FUNCTIONS:
            assert following == ("punct", "(") or items[index + 1][1] in GROUPING, expr
        elif kind == "name" and text not in KEYWORDS:
            selector = Selector(text)
            if following[0] == "matchers":
                selector.matchers = matchers(following[1])
                index += 1
            query.selectors.append(selector)
        elif kind == "matchers":
            query.selectors.append(Selector(None, matchers(text)))
        index += 1
    return query


# -- what the package registers -------------------------------------------------------------


@dataclass(frozen=True)
class Exposed:
    """One series name Prometheus scrapes from the package, with its labels and family."""

    family: str
    labels: frozenset[str]


def exposed() -> dict[str, Exposed]:
    """Every series name ``celery_singleton_lock.metrics`` exposes (``metrics.exposed``):
    the families :class:`LockMetrics` registers and the limit gauges read at each scrape."""
    return {
        series.name: Exposed(series.family, frozenset(series.labels))
        for series in metrics.exposed()
    }


# -- what the dashboard asks -----------------------------------------------------------------


def panels(panel_list: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' panels included."""
    for panel in panel_list:
        yield panel
        yield from panels(panel.get("panels") or [])


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str, str | None]]:
    """``(where, PromQL expression, label asked for)`` of every query of ``dashboard``: each
    panel target's ``expr``, and the selector of each ``label_values(selector, label)``
    variable."""
    for panel in panels(dashboard.get("panels") or []):
        for target in panel.get("targets") or []:
            yield f"panel {panel.get('title')!r}", target["expr"], None
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        text = query.get("query") if isinstance(query, dict) else query
        found = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_]\w*)\)\s*", str(text))
        assert found, f"variable {variable.get('name')}: not a label_values() query: {text!r}"
        yield f"variable {variable.get('name')!r}", found.group(1), found.group(2)


def load(path: Path) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return found


def selected(selector: Selector, names: dict[str, Exposed]) -> list[str]:
    """The exposed series names ``selector`` can match: its metric name, or those its
    ``__name__`` matchers accept."""
    candidates = [selector.metric] if selector.metric else list(names)
    for label, operator, value in selector.matchers:
        if label != "__name__":
            continue
        match = {"=": str.__eq__, "!=": str.__ne__}.get(operator)
        if match is not None:
            candidates = [c for c in candidates if match(c, value)]
        else:  # =~ and !~ match the whole name, as Prometheus anchors its regexes
            pattern, keep = re.compile(value), operator == "=~"
            candidates = [c for c in candidates if bool(pattern.fullmatch(c)) == keep]
    return candidates


# -- the tests --------------------------------------------------------------------------------


def test_the_reader_understands_promql() -> None:
    """The expression reader finds metric names, matchers and grouping labels, and skips
    functions, keywords, ranges and Grafana's variables."""
    query = parse(
        "histogram_quantile(0.95, sum by (le, task) "
        '(rate(x_bucket{task=~"$task"}[$__rate_interval])))'
        " / on (task) group_left sum(rate(y_total[5m])) or vector(0)"
    )
    assert [(s.metric, s.matchers) for s in query.selectors] == [
        ("x_bucket", [("task", "=~", "$task")]),
        ("y_total", []),
    ]
    assert query.grouping == {"le", "task"}
    (bare,) = parse('count({__name__=~"a_.+", job="j"})').selectors
    assert (bare.metric, bare.matchers) == (None, [("__name__", "=~", "a_.+"), ("job", "=", "j")])
    with pytest.raises(ValueError, match="cannot read"):
        parse("sum(rate(x_total[5m])) ?? 1")


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.name)
def test_every_metric_the_dashboard_queries_exists(path: Path) -> None:
    """Every series a query of the dashboard selects is one the package exposes, every
    label it matches or groups by is one of that series' labels, and every variable asks
    for a label those series have."""
    names = exposed()
    dashboard = load(path)
    checked = 0
    for where, expr, label in queries(dashboard):
        query = parse(expr)
        assert query.selectors, f"{where}: no series in {expr!r}"
        labels: set[str] = set()
        for selector in query.selectors:
            matched = selected(selector, names)
            assert matched, f"{where}: {selector} selects no metric of the package ({expr!r})"
            unknown = [name for name in matched if name not in names]
            assert not unknown, f"{where}: {unknown} are not metrics of the package ({expr!r})"
            series_labels = set.union(*(set(names[name].labels) for name in matched))
            for matcher_label, _, _ in selector.matchers:
                assert matcher_label in series_labels | {"__name__"}, (
                    f"{where}: {selector.metric} has no label {matcher_label!r}"
                )
            labels |= series_labels
            checked += 1
        assert query.grouping <= labels, f"{where}: groups by {query.grouping - labels} ({expr!r})"
        if label is not None:
            assert label in labels, f"{where}: the series have no label {label!r}"
    assert checked >= 10, "the dashboard's queries were not found"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.name)
def test_the_dashboard_charts_every_metric(path: Path) -> None:
    """Each metric family the package exposes is charted by some panel: a metric added
    to ``celery_singleton_lock.metrics`` (a counter, a histogram or a gauge read at each
    scrape) needs a panel too."""
    names = exposed()
    charted = {
        names[selector.metric].family
        for where, expr, _ in queries(load(path))
        if where.startswith("panel")
        for selector in parse(expr).selectors
        if selector.metric in names
    }
    families = {entry.family for entry in names.values()}
    assert families - charted == set(), f"{path.name} charts none of {sorted(families - charted)}"
    assert all(family.startswith(PREFIX) for family in families)


def test_the_dashboards_are_there() -> None:
    assert DASHBOARDS, "no dashboard under examples/grafana/dashboards"
