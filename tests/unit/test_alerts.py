"""The alerts of docs/operations.md ("What to alert on") can fire, say why, and never page alone.

That block is the chart's PrometheusRule verbatim (tests/unit/test_chart_parity.py renders the
chart and compares). Here, without a cluster, each alert is checked against the registries the
processes serve (``vkprovider.metrics.Metrics`` on the acting provider replica,
``StandbyMetrics`` on a standby, ``CompanionMetrics`` on the companion; the e2e leader-election
test scrapes real replicas and compares them with these registries):

* every alert has a ``severity`` label and ``summary`` and ``description`` annotations;
* every metric an alert reads is exported by one of the processes (or is kube-state-metrics');
* a standby exports nothing an alert reads but ``vkprovider_leader``, so no alert counts a standby;
* every selector of our metrics names the release's node (``virtual_node``), so several releases
  do not alert on each other's nodes, and ``VKProviderDown`` reads ``vkprovider_leader``, whose
  ``virtual_node`` the process sets itself: it works with any scrape configuration (no ``job``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from vkprovider.descheduler.metrics import CompanionMetrics
from vkprovider.metrics import LEADER, Metrics, StandbyMetrics

DOCS = Path(__file__).resolve().parents[2] / "docs"
NODE = "vk-gpu-burst"  # node.name's default: what the documented rule is rendered with
SEVERITIES = {"critical", "warning", "info"}
#: metrics of other exporters an alert may read, and who exports them
EXTERNAL = {"kube_node_status_condition": "kube-state-metrics"}
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
             "gauge": ("",), "summary": ("", "_sum", "_count"), "unknown": ("",)}
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
             "group_right", "offset", "bool", "inf", "nan"}


def documented_rules() -> list[dict[str, Any]]:
    text = (DOCS / "operations.md").read_text()
    block = text.split("## What to alert on", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    rule = yaml.safe_load(block)
    (group,) = rule["spec"]["groups"]
    rules: list[dict[str, Any]] = group["rules"]
    assert rules, "no alert documented"
    return rules


def selectors(expr: str) -> list[tuple[str, str]]:
    """(metric name, label matchers text) of every vector selector in a PromQL expression."""
    text = re.sub(r"\[[^\]]*\]", "", expr)  # range durations
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    out = []
    for match in re.finditer(r"(?<![\w.\"])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?(\s*\()?",
                             text):
        name, labels, call = match.group(1), match.group(2) or "", match.group(3)
        if (call and not labels) or name in _KEYWORDS:
            continue  # a function call, or a keyword
        if re.fullmatch(r"[0-9.]+|e", name):
            continue
        out.append((name, labels))
    return out


def exported(registry: Any) -> set[str]:
    """The series names a registry exposes (a counter only as ``_total``, a histogram's
    ``_bucket``/``_sum``/``_count``)."""
    return {family.name + suffix for family in registry.collect()
            for suffix in _SUFFIXES[family.type]}


def leader_metrics() -> Metrics:
    metrics = Metrics()
    metrics.leader.labels(NODE).set(1)
    return metrics


def test_the_selector_parser_finds_what_an_alert_reads() -> None:
    """The parser these tests rest on, on shapes the alerts use."""
    assert selectors('sum by (virtual_node, le) (rate(a_bucket{x="1",y=~"b|c"}[15m])) > 120'
                     ) == [("a_bucket", '{x="1",y=~"b|c"}')]
    assert selectors("histogram_quantile(0.99, sum(rate(h_bucket[5m])))") == [("h_bucket", "")]
    assert [n for n, _ in selectors(
        '(l{v="n"} == 1) unless on (virtual_node) q{v="n"}')] == ["l", "q"]
    assert [n for n, _ in selectors('absent(up{job="x"} == 1) and on () m > 0')] == ["up", "m"]


@pytest.mark.parametrize("rule", documented_rules(), ids=lambda r: r["alert"])
def test_every_alert_has_a_severity_a_summary_and_a_description(rule: dict[str, Any]) -> None:
    assert (rule.get("labels") or {}).get("severity") in SEVERITIES, (
        f"{rule['alert']}: labels.severity must be one of {sorted(SEVERITIES)}")
    annotations = rule.get("annotations") or {}
    for key in ("summary", "description"):
        assert isinstance(annotations.get(key), str) and annotations[key].strip(), (
            f"{rule['alert']}: no {key} annotation")


def test_every_metric_an_alert_reads_is_exported() -> None:
    provider = exported(leader_metrics().registry) | exported(StandbyMetrics(node=NODE).registry)
    companion = exported(CompanionMetrics().registry)
    unknown = {}
    for rule in documented_rules():
        names = {name for name, _ in selectors(rule["expr"])}
        assert names, f"{rule['alert']}: reads no metric"
        missing = names - provider - companion - set(EXTERNAL)
        if missing:
            unknown[rule["alert"]] = sorted(missing)
    assert not unknown, f"alerts read metrics no process exports: {unknown}"


def test_no_alert_reads_what_a_standby_exports_but_its_leader_gauge() -> None:
    """A standby's figures would count twice in a sum, or page while the leader is fine."""
    standby = exported(StandbyMetrics(node=NODE).registry)
    assert LEADER in standby and not any(n.startswith("vkprovider_") and n != LEADER
                                         for n in standby), standby
    for rule in documented_rules():
        read = {name for name, _ in selectors(rule["expr"])}
        assert not (read & standby) - {LEADER}, rule["alert"]


def test_every_alert_selects_its_release_node() -> None:
    """Several releases (one per virtual node) share a job: each alert reads only its node."""
    for rule in documented_rules():
        for name, labels in selectors(rule["expr"]):
            key = "node" if name in EXTERNAL else "virtual_node"
            assert re.search(rf'\b{key}="{NODE}"', labels), (
                f"{rule['alert']}: {name}{labels} does not select {key}=\"{NODE}\"")


def test_the_down_alert_needs_nothing_from_the_scrape_configuration() -> None:
    """VKProviderDown reads the leader gauge (virtual_node set by the process), not ``up`` of a
    job name that only the chart's ServiceMonitor gives; a standby's 0 does not satisfy it."""
    (down,) = [r for r in documented_rules() if r["alert"] == "VKProviderDown"]
    assert {name for name, _ in selectors(down["expr"])} == {LEADER}
    assert "job" not in down["expr"] and "== 1" in down["expr"]
    standby = StandbyMetrics(node=NODE).render().decode()
    assert f'{LEADER}{{virtual_node="{NODE}"}} 0.0' in standby.splitlines()


def test_a_fresh_companion_shows_no_move_back_dip() -> None:
    """VKProviderMoveBackDip reads min(vkprovider_moveback_min_ready_ratio) < 1: a gauge that
    starts at 0 on every replica fired it from the start, on the standby for ever."""
    text = CompanionMetrics().registry
    (family,) = [f for f in text.collect() if f.name == "vkprovider_moveback_min_ready_ratio"]
    assert [s.value for s in family.samples] == [1.0]
