"""docs/pod-spec.md, rendered from the fidelity table.

Why it exists apart from :mod:`vkprovider.node.fidelity`: the table is what the provider runs on
(refusals and warnings at pod create); this is only how it is shown to users, so the running
provider never imports it. ``python -m vkprovider.node.fidelitydoc [--check] [PATH]`` writes the
document (or checks it is current; a unit test does the same).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from vkprovider.node.fidelity import (
    CHILD_SCHEMA,
    CLOUD_TYPES,
    COMPLETE_SCHEMAS,
    ENTRIES,
    CloudType,
    Entry,
    Rule,
)
from vkprovider.node.fieldpaths import segments

__all__ = ["DOC_PATH", "main", "render_markdown"]

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "pod-spec.md"


def _section(entry: Entry) -> str:
    """The doc section of an entry: the last schema of :data:`COMPLETE_SCHEMAS` that owns a
    property its path names (``spec.os.name`` is in the pod's, a probe's port in the probes')."""
    schema: str | None = "PodSpec"
    section = "PodSpec"
    for names, _ in segments(entry.path)[1:]:
        if schema is None:
            break
        if schema in COMPLETE_SCHEMAS:
            section = schema
        schema = CHILD_SCHEMA.get((schema, names[0]))
    return section


_CLOUD_TITLES: Mapping[CloudType, str] = {
    "mock": "mock", "runpod": "RunPod", "vastai": "Vast.ai", "salad": "SaladCloud"}

_INTRO = """\
What happens to every field of a pod's `spec` and its container when the pod runs on a GPU
cloud, per cloud type (`mock`, `runpod`, `vastai`, `salad`), for Kubernetes 1.37. Each field is

* **HONOURED**: it takes effect. The text says how it maps onto the cloud (the instance spec
  field and the cloud's own API field), or who uses it ("used by the scheduler": Kubernetes
  acts on it before the pod reaches the virtual node).
* **REFUSED**: the pod fails before any cloud call, with a Warning event and a status message
  that name the field (reasons `UnsupportedPodSpec`, `InvalidImageName`, `InvalidResources`).
  **REFUSED (adapter)**: that cloud's adapter refuses the pod before calling the cloud; another
  cloud the pod may use is tried, and if none can run it the pod fails with `ProviderRejected`.
* **WARNED**: the pod runs without it. When the pod sets it (column *When*), one `FieldsDropped`
  Warning event, as the pod is first sent to a cloud, names every such field with the reason
  below (only for the cloud types the pod may go to: its OverflowPolicy's providers, else all
  of the node's).

The pod runs in one cloud instance: exactly one container, and no volume but the
service-account token and a memory-backed emptyDir mounted at `/dev/shm` (its shared memory).
Field paths are patterns: `[*]` is any index or key, `{a,b}` either field. Where the clouds
differ, each cloud's decision and text are listed.

This file is generated from the table in `vkprovider/node/fidelity.py` by
`python -m vkprovider.node.fidelitydoc`; a unit test fails when they differ.
"""

_SECTION_TITLES: Mapping[str, str] = {
    "PodSpec": "Pod (`spec`)",
    "PodSecurityContext": "Pod security context (`spec.securityContext`)",
    "Container": "Container (`spec.containers[0]`)",
    "Probe": "Probes",
    "ResourceRequirements": "Container resources (`spec.containers[0].resources`)",
    "SecurityContext": "Container security context (`spec.containers[0].securityContext`)",
}


def _label(rule: Rule) -> str:
    return f"{rule.decision.value} (adapter)" if rule.by_adapter else rule.decision.value


def _grouped(values: Mapping[CloudType, str]) -> str:
    groups: dict[str, list[str]] = {}
    for cloud in CLOUD_TYPES:
        groups.setdefault(values[cloud], []).append(_CLOUD_TITLES[cloud])
    if len(groups) == 1:
        return next(iter(groups))
    return "<br>".join(f"**{', '.join(cs)}**: {v}" for v, cs in groups.items())


def render_markdown() -> str:
    """docs/pod-spec.md, from the table."""
    lines = ["# Pod spec fidelity", "", _INTRO.rstrip(), ""]
    sections: dict[str, list[Entry]] = {}
    for entry in ENTRIES:
        sections.setdefault(_SECTION_TITLES[_section(entry)], []).append(entry)
    for title, entries in sections.items():
        lines += [f"## {title}", "", "| Field | When | Decision | What happens |",
                  "|---|---|---|---|"]
        for entry in entries:
            decision = _grouped({c: _label(entry.rules[c]) for c in CLOUD_TYPES})
            text = _grouped({c: entry.rules[c].text for c in CLOUD_TYPES})
            lines.append(f"| `{entry.path}` | {entry.when or 'set'} | {decision} | {text} |")
        lines.append("")
    count = len(ENTRIES)
    lines.append(f"{count} entries, {count * len(CLOUD_TYPES)} decisions.")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vkprovider.node.fidelitydoc [--check] [PATH]``: write (or check) the doc."""
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    paths = [a for a in args if a != "--check"]
    path = Path(paths[0]) if paths else DOC_PATH
    text = render_markdown()
    if check:
        current = path.read_text() if path.exists() else ""
        if current != text:
            sys.stderr.write(f"{path} is stale: run python -m vkprovider.node.fidelitydoc\n")
            return 1
        return 0
    path.write_text(text)
    sys.stdout.write(f"wrote {path} ({len(ENTRIES)} entries)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
