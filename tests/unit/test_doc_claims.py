"""What docs/*.md promise exists in the code, and what the code has is in the docs (no cluster).

A doc that names a metric nobody exports, a setting the loader refuses, a CRD field the API server
prunes or an Event reason nothing emits sends an operator down a wrong path exactly when something
is broken. These tests read the docs and compare them with the code's own registries and models:

* metric names in docs/*.md and the Grafana dashboard <-> the two Prometheus registries
  (``vkprovider.metrics.Metrics``, ``vkprovider.descheduler.metrics.CompanionMetrics``);
* the YAML blocks of docs/configuration.md <-> the pydantic settings models, both ways;
* the field tables of docs/policies.md <-> the CRD schemas in manifests/crds, both ways;
* the Events table of docs/operations.md <-> the reasons the source emits;
* promises about behaviour that a reader acts on: the OverflowPolicy conditions and
  ``lastDecisions`` values, the move-back cooldown, which clouds report GPU figures, the
  companion's ``/healthz``.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
import types
import typing
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from vkprovider.config import CompanionSettings, Settings
from vkprovider.descheduler.metrics import CompanionMetrics
from vkprovider.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SOURCE = ROOT / "vkprovider"
CRDS = ROOT / "manifests" / "crds"
DASHBOARD = ROOT / "manifests" / "dashboards" / "vkprovider.json"

#: The series prometheus_client exposes per family type. A histogram's own name is what docs
#: call it (``vkprovider_sweep_duration_seconds``), but no series carries it: PromQL needs
#: ``_bucket``, ``_sum`` or ``_count``. A counter is only seen (and documented) with ``_total``.
_SERIES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count",
                                                            "_created"),
           "summary": ("", "_sum", "_count", "_created"), "gauge": ("",)}
_DOC_NAMES = {**_SERIES, "histogram": ("", "_bucket", "_sum", "_count")}


# ---- helpers -----------------------------------------------------------------------------------


def _families() -> dict[str, str]:
    """Every metric family of both registries: name -> type."""
    out: dict[str, str] = {}
    for registry in (Metrics().registry, CompanionMetrics().registry):
        for family in registry.collect():
            out[family.name] = family.type
    return out


def _sample_names(table: Mapping[str, tuple[str, ...]] = _SERIES) -> set[str]:
    """Every series name the registries expose (prometheus_client's suffixes included)."""
    return {f"{name}{suffix}" for name, kind in _families().items()
            for suffix in table.get(kind, ("",))}


def _doc(name: str) -> str:
    return (DOCS / name).read_text()


def _section(text: str, heading: str) -> str:
    """The text under ``heading`` (a whole markdown heading line) up to the next heading of the
    same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    start = lines.index(heading) + 1
    end = len(lines)
    for i in range(start, len(lines)):
        match = re.match(r"^(#+) ", lines[i])
        if match and len(match.group(1)) <= level and not _in_fence(lines, i):
            end = i
            break
    return "\n".join(lines[start:end])


def _in_fence(lines: list[str], index: int) -> bool:
    return sum(1 for line in lines[:index] if line.startswith("```")) % 2 == 1


def _tables(text: str) -> Iterator[list[list[str]]]:
    """Markdown tables in ``text``: rows of cells (header first, the ---- row dropped)."""
    rows: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                rows.append(cells)
        elif rows:
            yield rows
            rows = []


def _yaml_blocks(text: str) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", text, flags=re.S)


def _ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


# ---- metrics -----------------------------------------------------------------------------------


def test_every_metric_named_in_the_docs_is_exported() -> None:
    exported = _sample_names(_DOC_NAMES)
    unknown: set[str] = set()
    for path in sorted(DOCS.glob("*.md")):
        for name in re.findall(r"vkprovider_[a-z_]+", path.read_text()):
            if name.endswith("_"):  # a prefix such as vkprovider_pod_gpu_*
                if not any(e.startswith(name) for e in exported):
                    unknown.add(f"{path.name}: {name}*")
            elif name not in exported:
                unknown.add(f"{path.name}: {name}")
    assert not unknown, f"docs name metrics no registry exports: {sorted(unknown)}"


def test_every_exported_metric_is_documented() -> None:
    text = "\n".join(p.read_text() for p in DOCS.glob("*.md"))
    missing = sorted(name for name, kind in _families().items()
                     if not any(re.search(rf"\b{re.escape(name + s)}\b", text)
                                for s in _DOC_NAMES.get(kind, ("",))))
    assert not missing, f"no doc describes: {missing}"


_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
             "group_right", "offset", "bool", "inf", "nan", "atan2"}


def _metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (functions, keywords, labels and variables removed)."""
    text = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', '""', expr)
    text = re.sub(r"\$\{[^}]*\}|\$\w+", "", text)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    found = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if not call and name not in _KEYWORDS:
            found.add(name)
    return found


def _dashboard_exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            elif key == "definition" and isinstance(value, str):
                match = re.fullmatch(r"\s*label_values\(\s*([^,]+?)\s*,\s*\w+\s*\)\s*", value)
                yield match.group(1) if match else value
            elif key != "query":
                yield from _dashboard_exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _dashboard_exprs(item)


def test_the_dashboard_charts_every_metric_of_both_processes_and_nothing_else() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = _sample_names()
    used: set[str] = set()
    for expr in _dashboard_exprs(dashboard):
        names = _metric_names(expr)
        assert names <= exported, f"{expr!r} names metrics nobody exports: {names - exported}"
        used |= names
    families = _families()
    uncharted = sorted(name for name, kind in families.items()
                       if not any(name + s in used for s in _SERIES.get(kind, ("",))))
    assert not uncharted, f"the dashboard has no panel for: {uncharted}"


def test_every_companion_metric_is_updated_by_the_companion() -> None:
    """A metric that is declared and documented but never moves is a silent lie on a graph."""
    metrics = CompanionMetrics()
    code = "\n".join(p.read_text() for p in (SOURCE / "descheduler").glob("*.py")
                     if p.name != "metrics.py")
    idle = sorted(attr for attr, value in vars(metrics).items()
                  if attr != "registry" and hasattr(value, "_name")
                  and not re.search(rf"\.{attr}\.(labels|inc|set|observe|dec)\b", code))
    assert not idle, f"declared in CompanionMetrics but never updated: {idle}"


# ---- settings ----------------------------------------------------------------------------------


def _nested_model(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(model, is_list) for a field whose values are settings models (or lists of them)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (tuple, list) and args and isinstance(args[0], type) and issubclass(
            args[0], BaseModel):
        return args[0], True
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            model, many = _nested_model(arg)
            if model is not None:
                return model, many
    return None, False


def _documented_paths(data: Mapping[str, Any], model: type[BaseModel], prefix: str,
                      unknown: list[str]) -> set[str]:
    paths: set[str] = set()
    for key, value in data.items():
        path = f"{prefix}{key}"
        field = model.model_fields.get(key)
        if field is None:
            unknown.append(path)
            continue
        paths.add(path)
        nested, many = _nested_model(field.annotation)
        if nested is None:
            continue
        items = value if many and isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, Mapping):
                paths |= _documented_paths(item, nested, f"{path}{'[]' if many else ''}.",
                                           unknown)
    return paths


def _model_paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    paths: set[str] = set()
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        paths.add(path)
        nested, many = _nested_model(field.annotation)
        if nested is not None:
            paths |= _model_paths(nested, f"{path}{'[]' if many else ''}.")
    return paths


def _settings_blocks() -> list[tuple[str, type[BaseModel], dict[str, Any]]]:
    text = _doc("configuration.md")
    main = yaml.safe_load(_yaml_blocks(text)[0])
    companion = yaml.safe_load(_yaml_blocks(_section(
        text, "## The companion's settings (`vkprovider descheduler`)"))[0])
    return [("vkprovider run", Settings, main), ("vkprovider descheduler", CompanionSettings,
                                                 companion)]


def test_every_documented_setting_exists_and_every_setting_is_documented() -> None:
    for what, model, data in _settings_blocks():
        unknown: list[str] = []
        documented = _documented_paths(data, model, "", unknown)
        assert not unknown, f"docs/configuration.md ({what}) documents unknown settings: {unknown}"
        missing = sorted(_model_paths(model) - documented)
        assert not missing, f"docs/configuration.md ({what}) does not document: {missing}"


def test_the_documented_settings_blocks_load() -> None:
    """The reference blocks are valid files (defaults and all), not just lists of names."""
    for what, model, data in _settings_blocks():
        model.model_validate(data)  # raises, naming the field, when a documented value is wrong
        assert data, what


def _wrong_defaults(data: Mapping[str, Any], model: type[BaseModel], prefix: str
                    ) -> list[str]:
    out: list[str] = []
    for key, value in data.items():
        field = model.model_fields[key]
        nested, many = _nested_model(field.annotation)
        if nested is not None and not many and isinstance(value, Mapping):
            out += _wrong_defaults(value, nested, f"{prefix}{key}.")
            continue
        if many:
            continue  # ``providers:`` is an example entry, not defaults
        default = field.get_default(call_default_factory=True)
        if default is PydanticUndefined:
            continue
        shown = tuple(value) if isinstance(default, tuple) and isinstance(value, list) else value
        if shown != default:
            out.append(f"{prefix}{key}: the doc says {value!r}, the default is {default!r}")
    return out


def test_every_documented_value_is_the_default() -> None:
    """The reference blocks show the defaults (an operator copies them as such)."""
    for what, model, data in _settings_blocks():
        wrong = _wrong_defaults(data, model, "")
        assert not wrong, f"docs/configuration.md ({what}): {wrong}"


# ---- CRD fields --------------------------------------------------------------------------------


def _crd_schema(kind: str) -> dict[str, Any]:
    for path in CRDS.glob("*.yaml"):
        for obj in yaml.safe_load_all(path.read_text()):
            if obj and obj.get("kind") == "CustomResourceDefinition" and obj["spec"]["names"][
                    "kind"] == kind:
                schema: dict[str, Any] = obj["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
                return schema
    raise AssertionError(f"no CRD for {kind} in {CRDS}")


def _schema_paths(schema: Mapping[str, Any], prefix: str = "") -> set[str]:
    paths: set[str] = set()
    if schema.get("type") == "array":
        schema = schema.get("items") or {}
    for name, sub in (schema.get("properties") or {}).items():
        path = f"{prefix}{name}"
        paths.add(path)
        paths |= _schema_paths(sub, f"{path}.")
    return paths


def _doc_fields(kind: str, part: str) -> set[str]:
    """Field paths in the first column of the ``### spec``/``### status`` tables of a kind."""
    text = _section(_doc("policies.md"), f"## {kind}")
    heading = next(line for line in text.splitlines() if line.startswith(f"### {part}"))
    fields: set[str] = set()
    for table in _tables(_section(text, heading)):
        if table[0][0] != "field":
            continue
        for row in table[1:]:
            fields |= {name.removesuffix("[]") for name in _ticked(row[0])}
    assert fields, f"no field table under {kind} / {heading}"
    return fields


def _covered(path: str, documented: set[str]) -> bool:
    """Documented itself, as part of a documented parent, or through documented children."""
    parts = path.split(".")
    return (any(".".join(parts[:i]) in documented for i in range(1, len(parts) + 1))
            or any(d.startswith(path + ".") for d in documented))


def test_policies_doc_tables_match_the_crd_schemas() -> None:
    for kind in ("GPUProvider", "OverflowPolicy"):
        schema = _crd_schema(kind)["properties"]
        for part in ("spec", "status"):
            in_crd = _schema_paths(schema[part])
            documented = _doc_fields(kind, part)
            unknown = sorted(documented - in_crd)
            assert not unknown, f"docs/policies.md {kind} {part} names fields the CRD lacks: " \
                                f"{unknown}"
            missing = sorted(p for p in in_crd if not _covered(p, documented))
            assert not missing, f"docs/policies.md does not document {kind} {part}: {missing}"


def test_the_move_back_cooldown_is_described_as_the_code_applies_it() -> None:
    """moveback.py: only failed moves start a cooldown, and it doubles with each failure."""
    moveback = _doc("moveback.md")
    policies = _doc("policies.md")
    crd = _crd_schema("OverflowPolicy")["properties"]["spec"]["properties"]["moveBack"]
    texts = {
        "CRD moveBack.cooldown description": crd["properties"]["cooldown"]["description"],
        "policies.md moveBack.cooldown row": next(
            line for line in policies.splitlines() if line.startswith("| `moveBack.cooldown`")),
        "moveback.md knob row": next(line for line in moveback.splitlines()
                                     if "| `moveBack.cooldown`" in line),
    }
    for where, text in texts.items():
        assert re.search(r"fail", text, re.I), f"{where} must say the cooldown follows failures"
        assert re.search(r"doubl", text, re.I), f"{where} must say the cooldown doubles"
        assert not re.search(r"after a move\b(?! fail)", text, re.I), \
            f"{where} says a successful move starts a cooldown: {text!r}"
    for name, text in (("policies.md", policies), ("moveback.md", moveback)):
        assert not re.search(r"alone (for )?[0-9]+ minutes after\b", text), \
            f"{name} says a workload is left alone after every move"


# ---- Events ------------------------------------------------------------------------------------


def _camel(value: object) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[A-Z][A-Za-z]+", value) is not None


def _reasons_in(tree: ast.AST) -> set[str]:
    """CamelCase strings given as ``reason=`` or assigned to a name that says ``reason``."""
    found: set[str] = set()
    for node in ast.walk(tree):
        values: list[ast.AST] = []
        if isinstance(node, ast.Call):
            values = [k.value for k in node.keywords if k.arg == "reason"]
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and "reason" in t.id.lower() for t in targets):
                values = [node.value] if node.value is not None else []
        for value in values:
            found |= {c.value for c in ast.walk(value)
                      if isinstance(c, ast.Constant) and _camel(c.value)}
    return found


def _emitted_reasons(paths: list[Path]) -> set[str]:
    """Reasons passed literally to ``emit``/``record``/``_reject`` (Events on objects)."""
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            name = (node.func.attr if isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    else node.func.id if isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name) else None)
            if name in ("emit", "record", "_reject", "reject"):
                assert isinstance(node, ast.Call)
                found |= {k.value.value for k in node.keywords
                          if k.arg == "reason" and isinstance(k.value, ast.Constant)
                          and _camel(k.value.value)}
    return found


def _events_table() -> set[str]:
    section = _section(_doc("operations.md"), "## Reading events")
    [table] = [t for t in _tables(section) if t[0][0] == "reason"]
    return {name for row in table[1:] for name in _ticked(row[0])}


def test_every_documented_event_reason_is_emitted_by_the_code() -> None:
    in_code: set[str] = set()
    for path in SOURCE.rglob("*.py"):
        in_code |= _reasons_in(ast.parse(path.read_text()))
    missing = sorted(_events_table() - in_code)
    assert not missing, f"docs/operations.md lists Event reasons nothing emits: {missing}"


def test_every_event_the_pod_controller_emits_is_documented() -> None:
    emitted = _emitted_reasons([SOURCE / "node" / f"{name}.py" for name in (
        "pods", "podcreate", "podsync", "podend", "podsweep")])  # the engine's modules
    # the parser still sees the calls (Events, and rejections through podsync.reject)
    assert {"Started", "NoCapacity", "NotAdmitted", "LivenessProbeFailed"} <= emitted
    missing = sorted(emitted - _events_table())
    assert not missing, f"docs/operations.md's Events table lacks: {missing}"


def test_every_event_the_companion_emits_is_documented() -> None:
    emitted = _emitted_reasons(sorted((SOURCE / "descheduler").glob("*.py")))
    docs = _events_table() | set(re.findall(r"`([A-Z][A-Za-z]+)`", _doc("moveback.md")))
    missing = sorted(emitted - docs)
    assert not missing, f"no doc lists the companion's Event reasons: {missing}"


# ---- OverflowPolicy status ---------------------------------------------------------------------


def _condition_rows() -> list[list[str]]:
    section = _section(_doc("policies.md"), "## Conditions")
    [table] = [t for t in _tables(section) if t[0][:2] == ["kind", "type"]]
    return table[1:]


def test_the_overflow_policy_conditions_in_the_docs_are_the_ones_written() -> None:
    from vkprovider.descheduler import policystatus
    from vkprovider.placement import policy as pol
    from vkprovider.placement.budget import Usage

    documented = {_ticked(row[1])[0]: row for row in _condition_rows()
                  if row[0] in ("both", "OverflowPolicy")}
    write = getattr(policystatus, "policy_conditions", None)
    assert write is not None, "policystatus.py writes only Valid: no policy_conditions()"
    spec = {"providers": ["a", "b"], "limits": {"maxPods": 2, "maxGPUs": 4,
                                                "maxPricePerHour": 5.0}}
    policy = pol.parse_overflow_policy({"metadata": {"name": "p", "generation": 3},
                                        "spec": spec})

    def provider(ready: str, reason: str) -> dict[str, Any]:
        return {"metadata": {"name": "x", "generation": 1},
                "status": {"observedGeneration": 1, "conditions": [
                    {"type": "Ready", "status": ready, "reason": reason, "message": ""}]}}

    now = datetime(2025, 1, 1, tzinfo=UTC)
    scenarios = [
        ([], Usage(), {"a": provider("True", "Healthy"), "b": provider("False", "AuthFailed")}),
        ([], Usage(pods=2, gpus=2), {"a": provider("False", "Unreachable"),
                                     "b": provider("False", "AuthFailed")}),
        ([], Usage(pods=1, gpus=4), {"a": provider("Unknown", "NotContacted")}),
        ([], Usage(pods=1, gpus=1, price_per_hour=5.0), {}),
        ([pol.Problem(field="spec.providers[1]", message="no", reason="UnknownProvider")],
         Usage(), {"a": provider("True", "Healthy")}),
    ]
    seen: dict[str, set[tuple[str, str]]] = {}
    for problems, usage, providers in scenarios:
        conds = write(policy=policy, problems=problems, usage=usage, providers=providers,
                      old=[], now=now)
        assert {c["type"] for c in conds} == set(documented), conds
        for c in conds:
            assert c["observedGeneration"] == 3 and c["lastTransitionTime"], c
            seen.setdefault(c["type"], set()).add((c["status"], c["reason"]))
    ready_reasons = {r for s, r in seen["Ready"] if s == "False"}
    assert {"Invalid", "NoReadyProvider"} <= ready_reasons
    for reason in ("MaxPods", "MaxGPUs", "MaxPricePerHour"):
        assert reason in _ticked(documented["BudgetExhausted"][3])
        assert ("True", reason) in seen["BudgetExhausted"]


def test_every_documented_decision_is_recorded_by_the_companion() -> None:
    row = next(r for t in _tables(_section(_doc("policies.md"), "## OverflowPolicy"))
               for r in t if r[0].startswith("`lastDecisions[]`"))
    documented = {name for name in _ticked(row[1]) if _camel(name)}
    assert {"Admitted", "MovedBack"} <= documented, row
    code = "\n".join(p.read_text() for p in (SOURCE / "descheduler").glob("*.py"))
    recorded = set(re.findall(r'decision="([A-Za-z]+)"', code))
    missing = sorted(documented - recorded)
    assert not missing, f"status.lastDecisions never gets: {missing}"


# ---- GPU figures -------------------------------------------------------------------------------


def test_the_docs_name_every_cloud_that_reports_gpu_figures() -> None:
    from providers.mock.client import MockProvider
    from providers.runpod import RunPodProvider
    from providers.salad import SaladProvider
    from providers.vastai import VastAIProvider

    names = {MockProvider: "mock cloud", RunPodProvider: "RunPod", VastAIProvider: "Vast.ai",
             SaladProvider: "Salad"}
    section = _section(_doc("operations.md"), "### GPUs of burst pods")
    intro = section.split("|", 1)[0]
    for cls, name in names.items():
        reports = hasattr(cls, "gpu_metrics") or hasattr(cls, "gpu_metrics_all")
        if reports:
            assert name in intro, f"operations.md does not say {name} reports GPU figures"


# ---- the companion's /healthz ------------------------------------------------------------------


def test_the_companion_serves_healthz_and_metrics_as_documented() -> None:
    from vkprovider.descheduler import service

    make = getattr(service, "metrics_app", None)
    assert make is not None, "the companion serves no /healthz (service.metrics_app)"
    metrics = CompanionMetrics()
    state = {"ok": True}
    app = make(registry=metrics.registry,
               health=lambda: (state["ok"], "ok" if state["ok"] else "informers not synced"))

    async def get(path: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://companion") as http:
            return await http.get(path)

    assert asyncio.run(get("/healthz")).status_code == 200
    state["ok"] = False
    down = asyncio.run(get("/healthz"))
    assert down.status_code == 503 and "informers not synced" in down.text
    scrape = asyncio.run(get("/metrics"))
    assert scrape.status_code == 200 and "vkprovider_moveback_in_flight" in scrape.text
    assert asyncio.run(get("/nope")).status_code == 404
    ops = _doc("operations.md")
    assert re.search(r"companion.*/healthz|/healthz.*companion", ops, re.I | re.S)


# ---- examples a reader copies, and what the quickstart promises ---------------------------------


def _gpuprovider_examples() -> list[tuple[str, dict[str, Any]]]:
    """Every GPUProvider object in a ```yaml block of docs/**/*.md."""
    found = []
    for path in sorted(DOCS.rglob("*.md")):
        for block in _yaml_blocks(path.read_text()):
            try:
                objs = list(yaml.safe_load_all(block))
            except yaml.YAMLError:
                continue  # fragments (values files, settings) are other tests' business
            for obj in objs:
                if isinstance(obj, dict) and obj.get("kind") == "GPUProvider":
                    found.append((str(path.relative_to(ROOT)), obj))
    return found


def test_every_gpuprovider_example_in_the_docs_builds_its_adapter(monkeypatch: Any) -> None:
    """A copied example must be Valid=True: its options are what the adapter accepts (the
    RunPod example said ``cloudType``, which the adapter refuses; its option is ``cloud``)."""
    import socket

    from vkprovider.placement.policy import parse_gpu_provider
    from vkprovider.registry import build_from_spec

    def refuse(self: socket.socket, address: Any) -> None:
        raise AssertionError(f"an adapter connected to {address} while being built")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    examples = _gpuprovider_examples()
    assert any(obj["spec"]["type"] == "runpod" for _, obj in examples), examples

    async def build(obj: dict[str, Any]) -> None:
        provider = parse_gpu_provider(obj)
        adapter = build_from_spec(name=provider.name, spec=provider.spec,
                                  api_key="fake-key-for-tests", owner="vk-docs", timeout=5.0)
        await adapter.aclose()

    for where, obj in examples:
        try:
            asyncio.run(build(obj))
        except Exception as exc:  # the adapter's own refusal, named with the page
            raise AssertionError(f"{where}: GPUProvider {obj['metadata']['name']}: {exc}") from exc


def test_the_spend_metric_says_where_the_record_is_kept() -> None:
    from vkprovider.node.spend import spend_lease_path

    family = next(m for m in Metrics().registry.collect() if m.name == "vkprovider_spend_dollars")
    lease = spend_lease_path(namespace="ns", node="<node>").rsplit("/", 1)[1]
    assert f"Lease {lease}" in family.documentation, family.documentation
    assert "on the Node" not in family.documentation


def test_the_standby_is_described_as_it_runs() -> None:
    """configuration.md and install.md say the same about a standby provider replica, and what
    the Deployment does: it answers /healthz, so it is Ready, and the rollout strategy is the
    manifests' (configuration.md used to say "not Ready" and "Recreate")."""
    deployment = yaml.safe_load((ROOT / "manifests/base/deployment.yaml").read_text())
    strategy = deployment["spec"]["strategy"]["type"]
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert probe["httpGet"]["path"] == "/healthz"
    leader = _section(_doc("configuration.md"), "## Leader election")
    install = _section(_doc("install.md"), "### Probes and rollouts")
    for name, text in (("configuration.md", leader), ("install.md", install)):
        flat = " ".join(text.split())
        assert "/healthz" in flat and "standby" in flat, name
        assert strategy in flat, f"{name} does not name the rollout strategy {strategy}"
        assert "/metrics" in flat and "vkprovider_leader" in flat, (
            f"{name} does not say a standby serves /metrics (vkprovider/service.py: standby_app)")
        for wrong in ("Recreate", "not Ready", "runs nothing but", "no `/metrics`"):
            assert wrong not in flat, f"{name} says {wrong!r} of the standby"


def _quickstart_bash() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", _doc("quickstart.md"), flags=re.S)


def test_what_the_quickstart_writes_in_the_checkout_is_ignored_by_git() -> None:
    """``vk.yaml``/``vk.log``/``dev.kubeconfig`` must not show up as untracked files."""
    import subprocess

    written: set[str] = set()
    for block in _quickstart_bash():
        written |= set(re.findall(r"(?:>|--kubeconfig-out)\s+([\w.-]+\.[a-z]+)\b", block))
    assert {"vk.yaml", "vk.log", "dev.kubeconfig"} <= written, written
    done = subprocess.run(["git", "-C", str(ROOT), "check-ignore", *sorted(written)],
                          capture_output=True, text=True, check=False)
    ignored = set(done.stdout.split())
    assert ignored == written, f"not in .gitignore: {sorted(written - ignored)}"


def test_the_quickstart_states_what_kueue_needs_and_how_settings_take_effect() -> None:
    page = " ".join(_doc("quickstart.md").split())
    kueue_source = (SOURCE / "testing" / "kueue.py").read_text()
    if '"unshare"' in kueue_source:  # Kueue's local run: make demo needs it
        assert "`unshare`" in page and "user namespaces" in page
    if '"--map-root-user"' in kueue_source:
        assert "--map-root-user" in page
    # settings are read once at start: editing the ConfigMap needs a restart, of Deployments
    # and a ConfigMap that exist under those names
    restart = re.search(r"rollout restart ((?:deployment/[\w-]+ ?)+)", page)
    assert restart, "the quickstart does not say how an edited ConfigMap takes effect"
    base = ROOT / "manifests" / "base"
    names = {obj["metadata"]["name"] for f in base.glob("*.yaml")
             for obj in yaml.safe_load_all(f.read_text()) if obj and obj["kind"] == "Deployment"}
    for ref in restart.group(1).split():
        assert ref.split("/", 1)[1] in names, ref
    configmap = re.search(r"edit configmap ([\w-]+)", page)
    assert configmap, "the quickstart does not name the ConfigMap"
    maps = {obj["metadata"]["name"] for f in base.glob("*.yaml")
            for obj in yaml.safe_load_all(f.read_text()) if obj and obj["kind"] == "ConfigMap"}
    assert configmap.group(1) in maps, (configmap.group(1), maps)


def test_the_quickstart_promises_provider_created_only_when_it_is_written() -> None:
    """With the default ``lifecycle_events: minimal`` ProviderCreated is written only while a
    boot is slow: the page must not promise it in ``kubectl describe`` unconditionally."""
    default = Settings.model_fields["pods"].default_factory().lifecycle_events  # type: ignore[misc]
    page = " ".join(_doc("quickstart.md").split())
    if default == "minimal":
        sentence = next(s for s in re.split(r"(?<=\.)\s", page) if "`ProviderCreated`" in s)
        assert "verbose" in sentence and "slow" in sentence, sentence
