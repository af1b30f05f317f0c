"""The status-write benchmark's bodies and its summary (the cluster part runs in bench only)."""

from __future__ import annotations

from bench.statuswrite import MODES, running, summarise


def test_every_round_writes_new_values() -> None:
    first, first_notes = running(7, round_=1)
    second, second_notes = running(7, round_=2)
    assert first != second and first_notes != second_notes
    assert first["phase"] == "Running" and first["podIPs"] == [{"ip": first["podIP"]}]
    assert running(8, round_=1)[0]["podIP"] != first["podIP"], "each pod its own address"


def test_the_summary_takes_medians_and_counts_the_cheapest_rounds() -> None:
    def sample(api: float) -> dict[str, float]:
        return {"etcd": 0.3, "kube-apiserver": api, "writers": 0.2}

    samples = {"strategic": [sample(2.4), sample(2.3), sample(2.8)],
               "merge": [sample(2.5), sample(2.6), sample(2.2)],
               "replace": [sample(2.2), sample(2.1), sample(2.4)]}
    info = {"cpu": "Test CPU", "cores": 2, "memory_gib": 24.0, "python": "3.11.9"}
    text, payload = summarise(n=10, rounds=3, samples=samples, info=info)
    replace = payload["results"]["replace"]
    assert replace["median_ms_per_write"]["kube-apiserver"] == 2.2
    assert replace["median_total_ms_per_write"] == 2.7
    assert replace["rounds_cheapest_for_apiserver"] == 2
    assert payload["results"]["merge"]["rounds_cheapest_for_apiserver"] == 1
    assert payload["results"]["strategic"]["rounds_cheapest_for_apiserver"] == 0
    assert set(payload["results"]) == set(MODES)
    assert text.startswith("machine: Test CPU, 2 cores")
    row = next(line for line in text.splitlines() if line.startswith("| replace"))
    assert [c.strip() for c in row.split("|")[1:-1]] == [
        "replace", "2.20 (2.10-2.40)", "0.30", "0.20", "2.70", "2 of 3"]
