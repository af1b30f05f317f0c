"""Pure parts of the pod engine's fault handling (issue 35): which duplicate stays, which
instances a sweep proves vanished, which endpoints a restart keeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from providers.base import Instance, InstanceState
from vkprovider.node.duplicates import keep_first
from vkprovider.node.placements import Placed
from vkprovider.node.slicehold import carry_held
from vkprovider.node.vanished import detect, wants_restart

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def placed(provider: str, iid: str, *, state: InstanceState = InstanceState.RUNNING,
           created: datetime | None = None, seen_at: float = 0.0,
           listed: bool = True) -> Placed:
    return Placed(provider=provider, seen_at=seen_at, listed=listed, instance=Instance(
        id=iid, name="n", provider=provider, state=state, created_at=created))


def test_the_duplicate_the_pod_names_stays_even_when_listed_second() -> None:
    first, second = placed("a", "i1", created=T0), placed("b", "i2", created=T0)
    keep, drop = keep_first(first, second, annotations={"vkprovider.io/provider": "b",
                                                        "vkprovider.io/instance-id": "i2"})
    assert (keep, drop) == (second, first)
    # ids are per cloud: the same id on another provider is not the one named
    keep, _ = keep_first(first, placed("c", "i2"), annotations={
        "vkprovider.io/provider": "b", "vkprovider.io/instance-id": "i2"})
    assert keep is first


def test_else_the_running_one_else_the_oldest_else_the_first_listed() -> None:
    booting = placed("a", "i1", state=InstanceState.PENDING, created=T0)
    running = placed("a", "i2", created=T0 + timedelta(minutes=5))
    assert keep_first(booting, running, annotations={})[0] is running
    older, newer = placed("a", "i3", created=T0), placed("a", "i4", created=T0 + timedelta(1))
    assert keep_first(newer, older, annotations=None)[0] is older
    x, y = placed("a", "i5"), placed("a", "i6")
    assert keep_first(x, y, annotations=None) == (x, y)


def test_a_sweep_proves_gone_only_what_a_later_good_list_left_out() -> None:
    before = {
        "gone": placed("a", "i1", seen_at=1.0),
        "ours": placed("a", "i2", seen_at=1.0),  # we asked for its delete
        "new": placed("a", "i3", seen_at=1.0, listed=False),  # known from our create only
        "unlisted": placed("b", "i4", seen_at=1.0),  # its provider's list failed
        "done": placed("a", "i5", seen_at=1.0, state=InstanceState.SUCCEEDED),
        "podless": placed("a", "i6", seen_at=1.0),
        "early": placed("c", "i7", seen_at=5.0),  # seen after that list began
    }
    out = detect(before=before, after={}, listed={"a": True, "b": False, "c": True},
                 list_started={"a": 2.0, "c": 4.0},
                 deleting=lambda key: 1.5 if key == ("a", "i2") else None,
                 pods=lambda uid: uid != "podless")
    assert [uid for uid, _ in out] == ["gone"]


def test_restart_policy_decides() -> None:
    assert wants_restart({"spec": {}}) and wants_restart({"spec": {"restartPolicy": "OnFailure"}})
    assert not wants_restart({"spec": {"restartPolicy": "Never"}})


def test_held_endpoints_are_carried_as_they_were() -> None:
    def ep(uid: str, addr: str) -> dict[str, object]:
        return {"addresses": [addr], "targetRef": {"kind": "Pod", "uid": uid}}

    existing = {"s1": {"metadata": {"name": "s1", "resourceVersion": "9"},
                       "endpoints": [ep("held", "198.18.0.1"), ep("gone", "198.18.0.2")]},
                "s2": {"metadata": {"name": "s2", "resourceVersion": "3"},
                       "endpoints": [ep("held2", "198.18.0.3")]}}
    desired = {"s1": {"metadata": {"name": "s1"}, "endpoints": [ep("told", "198.18.0.4")]}}
    carry_held(desired, existing, held={"held", "held2"}.__contains__)
    assert [e["targetRef"]["uid"] for e in desired["s1"]["endpoints"]] == ["told", "held"]
    assert [e["targetRef"]["uid"] for e in desired["s2"]["endpoints"]] == ["held2"]
    assert "resourceVersion" not in desired["s2"]["metadata"]
