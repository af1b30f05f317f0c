"""The Grafana dashboard and docs/operations.md name only metrics the service really exports.

A dashboard that queries a renamed metric shows "No data" exactly when someone needs it; these
tests read every PromQL expression in manifests/dashboards/vkprovider.json and compare the
metric names with those registered in vkprovider.metrics.Metrics.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vkprovider.descheduler.metrics import CompanionMetrics
from vkprovider.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "manifests" / "dashboards" / "vkprovider.json"
OPERATIONS = ROOT / "docs" / "operations.md"

_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
             "group_right", "offset", "bool", "inf", "nan", "atan2"}


def exported_names() -> set[str]:
    """Every sample name the two processes' registries can expose (the provider's and the
    companion's: the dashboard shows both), histogram and counter suffixes included."""
    names: set[str] = set()
    families = [*Metrics().registry.collect(), *CompanionMetrics().registry.collect()]
    for family in families:
        base = family.name
        if family.type == "counter":
            names |= {f"{base}_total", f"{base}_created"}
        elif family.type == "histogram":
            names |= {f"{base}_bucket", f"{base}_sum", f"{base}_count", f"{base}_created"}
        elif family.type == "summary":
            names |= {base, f"{base}_sum", f"{base}_count", f"{base}_created"}
        else:
            names.add(base)
    return names


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (functions, keywords, labels and variables removed)."""
    text = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', '""', expr)
    text = re.sub(r"\$\{[^}]*\}|\$\w+", "", text)  # Grafana variables
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    found = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name in _KEYWORDS:
            continue
        found.add(name)
    return found


def _exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            elif key == "query" and isinstance(value, dict) and isinstance(value.get("query"),
                                                                             str):
                yield _label_values(value["query"])
            elif key == "definition" and isinstance(value, str):
                yield _label_values(value)
            else:
                yield from _exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _exprs(item)


def _label_values(query: str) -> str:
    """``label_values(metric, label)`` -> ``metric`` (the part that names a metric)."""
    match = re.fullmatch(r"\s*label_values\(\s*([^,]+?)\s*,\s*\w+\s*\)\s*", query)
    return match.group(1) if match else query


def test_metric_name_parser() -> None:
    assert metric_names(
        'histogram_quantile(0.99, sum by (le, provider) (rate(a_bucket{job=~"$job"}[5m])))'
    ) == {"a_bucket"}
    assert metric_names('sum(x{a="b(c)"}) / on (pod) group_left (node) y offset 5m') == {"x", "y"}
    assert metric_names("count(z < 0.1) or vector(0)") == {"z"}
    assert metric_names("1e3 * w[$__rate_interval]") == {"w"}


def test_every_dashboard_expression_names_only_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_names()
    exprs = list(_exprs(dashboard))
    assert len(exprs) >= 20
    used: set[str] = set()
    for expr in exprs:
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        # ours, or the process_* figures both processes export (vkprovider.metrics)
        assert all(n.startswith(("vkprovider_", "process_")) for n in names), expr
        unknown = names - exported
        assert not unknown, f"{expr!r} names metrics the service does not export: {unknown}"
        used |= names
    for gpu in ("utilization_ratio", "tensor_active_ratio", "memory_used_bytes",
                "memory_total_bytes", "temperature_celsius", "power_watts"):
        assert f"vkprovider_pod_gpu_{gpu}" in used


def test_dashboard_is_importable_grafana_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert {"h", "w", "x", "y"} <= set(panel["gridPos"])


def test_operations_doc_describes_every_metric() -> None:
    text = OPERATIONS.read_text()
    missing = sorted(f.name for f in Metrics().registry.collect()
                     if f.name not in text and f"{f.name}_total" not in text)
    assert not missing, f"docs/operations.md does not describe: {missing}"
