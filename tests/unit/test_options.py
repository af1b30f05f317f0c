"""Unit tests of providers/options.py and of every adapter reading its options through it.

Table-driven: the readers alone (bool, number, int, string, list, duration, retry), then each
adapter's boolean options with every accepted spelling (``"false"`` is False), then a value of the
wrong kind for every adapter, whose error must name the option.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from providers import options as opt
from providers import runpod, salad, vastai
from providers.http import RetryPolicy
from providers.mock.client import MockProvider
from vkprovider.errors import ConfigError
from vkprovider.registry import build_adapter

SALAD_BASE = {"organization": "acme", "project": "burst"}

#: adapter type -> its options parser (what the adapter's constructor calls first)
PARSERS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "runpod": runpod._parse_options,
    "vastai": vastai._Options,
    "salad": lambda raw: salad._Options({**SALAD_BASE, **raw}),
}

TRUE_SPELLINGS = [True, "true", "True", "TRUE", " yes ", "Yes", "1", 1]
FALSE_SPELLINGS = [False, "false", "False", "FALSE", "no", "NO", "0", 0]
REFUSED_BOOLS = ["maybe", "", "t", "f", "on", "off", 2, -1, 0.5, [], {}]


# -- the readers -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", TRUE_SPELLINGS)
def test_boolean_true_spellings(value: Any) -> None:
    assert opt.boolean({"flag": value}, "flag", default=False) is True


@pytest.mark.parametrize("value", FALSE_SPELLINGS)
def test_boolean_false_spellings(value: Any) -> None:
    assert opt.boolean({"flag": value}, "flag", default=True) is False


@pytest.mark.parametrize("value", REFUSED_BOOLS)
def test_boolean_refuses_anything_else_naming_the_option(value: Any) -> None:
    with pytest.raises(opt.InvalidOption, match=r"^options\.flag: must be true or false"):
        opt.boolean({"flag": value}, "flag", default=True)


@pytest.mark.parametrize(("raw", "default", "expected"), [
    ({}, True, True),
    ({"flag": None}, False, False),  # an explicit null is the default
])
def test_boolean_default(raw: dict[str, Any], default: bool, expected: bool) -> None:
    assert opt.boolean(raw, "flag", default=default) is expected


@pytest.mark.parametrize(("reader", "value", "expected"), [
    (lambda raw: opt.number(raw, "x", default=1.0), 2, 2.0),
    (lambda raw: opt.number(raw, "x", default=1.0), 2.5, 2.5),
    (lambda raw: opt.number(raw, "x", default=1.0), " 2.5 ", 2.5),
    (lambda raw: opt.number(raw, "x", default=1.0), None, 1.0),
    (lambda raw: opt.number(raw, "x", default=1.0, minimum=0, maximum=1), 1, 1.0),
    (lambda raw: opt.optional_number(raw, "x"), None, None),
    (lambda raw: opt.integer(raw, "x", default=3), 20, 20),
    (lambda raw: opt.integer(raw, "x", default=3), 20.0, 20),
    (lambda raw: opt.integer(raw, "x", default=3), "20", 20),
    (lambda raw: opt.optional_integer(raw, "x", minimum=1), None, None),
    (lambda raw: opt.string(raw, "x", default="d"), "v", "v"),
    (lambda raw: opt.string(raw, "x", default="d"), None, "d"),
    (lambda raw: opt.choice(raw, "x", choices=("a", "b"), default="a"), "b", "b"),
    (lambda raw: opt.strings(raw, "x"), ["a", "b"], ("a", "b")),
    (lambda raw: opt.strings(raw, "x"), None, ()),
    (lambda raw: opt.duration(raw, "x", default=1.0), 2, 2.0),
    (lambda raw: opt.duration(raw, "x", default=1.0), "2.5", 2.5),
    (lambda raw: opt.duration(raw, "x", default=1.0), "500ms", 0.5),
    (lambda raw: opt.duration(raw, "x", default=1.0), "30s", 30.0),
    (lambda raw: opt.duration(raw, "x", default=1.0), "1m30s", 90.0),
    (lambda raw: opt.duration(raw, "x", default=1.0), "1h", 3600.0),
    (lambda raw: opt.name_map(raw, "x"), {"H100": "h", "A": ["a", "b"]},
     {"H100": ("h",), "A": ("a", "b")}),
])
def test_readers_accept(reader: Callable[[dict[str, Any]], Any], value: Any,
                        expected: Any) -> None:
    assert reader({"x": value}) == expected


@pytest.mark.parametrize(("reader", "value", "why"), [
    (lambda raw: opt.number(raw, "x", default=1.0), "many", "must be a number"),
    (lambda raw: opt.number(raw, "x", default=1.0), True, "must be a number"),
    (lambda raw: opt.number(raw, "x", default=1.0), [1], "must be a number"),
    (lambda raw: opt.number(raw, "x", default=1.0), "nan", "must be a number"),
    (lambda raw: opt.number(raw, "x", default=1.0), float("inf"), "must be a number"),
    (lambda raw: opt.number(raw, "x", default=1.0, minimum=0), -1, "must be a number >= 0"),
    (lambda raw: opt.number(raw, "x", default=1.0, minimum=0, above=True), 0, "> 0"),
    (lambda raw: opt.number(raw, "x", default=1.0, maximum=1), 1.5, "<= 1"),
    (lambda raw: opt.integer(raw, "x", default=1), 1.5, "must be an integer"),
    (lambda raw: opt.integer(raw, "x", default=1), "many", "must be an integer"),
    (lambda raw: opt.integer(raw, "x", default=1), False, "must be an integer"),
    (lambda raw: opt.integer(raw, "x", default=1, minimum=1), 0, "must be an integer >= 1"),
    (lambda raw: opt.string(raw, "x", default="d"), 5, "non-empty string"),
    (lambda raw: opt.string(raw, "x", default="d"), "", "non-empty string"),
    (lambda raw: opt.string(raw, "x", default="d", pattern=re.compile("^a")), "b", "must match"),
    (lambda raw: opt.choice(raw, "x", choices=("a", "b"), default="a"), "c", "one of a, b"),
    (lambda raw: opt.strings(raw, "x"), "a", "list of non-empty strings"),
    (lambda raw: opt.strings(raw, "x"), ["a", 1], "list of non-empty strings"),
    (lambda raw: opt.duration(raw, "x", default=1.0), "soon", "must be a duration"),
    (lambda raw: opt.duration(raw, "x", default=1.0), "5 minutes", "must be a duration"),
    (lambda raw: opt.duration(raw, "x", default=1.0, minimum=0), "-1s", "must be a duration"),
    (lambda raw: opt.mapping(raw, "x"), [1], "must be a mapping"),
    (lambda raw: opt.name_map(raw, "x"), {"H100": []}, "name or a list of names"),
])
def test_readers_refuse_naming_the_option(reader: Callable[[dict[str, Any]], Any], value: Any,
                                         why: str) -> None:
    with pytest.raises(opt.InvalidOption) as info:
        reader({"x": value})
    assert str(info.value).startswith("options.x")
    assert why in str(info.value)
    assert isinstance(info.value, ValueError), "the adapters' invalid-options error type"


def test_a_secret_option_is_never_quoted() -> None:
    with pytest.raises(opt.InvalidOption) as info:
        opt.optional_string({"image_login": 12345678}, "image_login", secret=True)
    assert "12345678" not in str(info.value)
    with pytest.raises(opt.InvalidOption) as info:
        opt.mapping({"auth": ["hunter2"]}, "auth", secret=True)
    assert "hunter2" not in str(info.value)


def test_unknown_options_keep_their_shape() -> None:
    with pytest.raises(opt.InvalidOption, match=r"^options: unknown Vast.ai option\(s\) bogus; "
                                                 r"known: a, b$"):
        opt.reject_unknown({"a": 1, "bogus": 2}, {"a", "b"}, cloud="Vast.ai")


def test_one_retry_default_for_every_adapter() -> None:
    expected = (opt.DEFAULT_RETRY.max_attempts, opt.DEFAULT_RETRY.backoff_initial,
                opt.DEFAULT_RETRY.backoff_max, opt.DEFAULT_RETRY.retry_after_cap)
    policy = RetryPolicy()
    assert (policy.max_attempts, policy.backoff_initial, policy.backoff_max,
            policy.retry_after_cap) == expected
    for kind, parse in PARSERS.items():
        parsed = parse({})
        got = (parsed.max_attempts, parsed.backoff_initial, parsed.backoff_max,
               parsed.retry_after_cap)
        assert got == expected, kind
    mock = MockProvider(name="m", base_url="http://127.0.0.1:1", owner="node")
    retry = mock._retry
    assert (retry.max_attempts, retry.backoff_initial, retry.backoff_max,
            retry.retry_after_cap) == expected


@pytest.mark.parametrize("kind", sorted(PARSERS))
def test_retry_options_take_durations(kind: str) -> None:
    parsed = PARSERS[kind]({"max_attempts": "2", "backoff_initial": "50ms",
                            "backoff_max": "1s", "retry_after_cap": 3})
    assert (parsed.max_attempts, parsed.backoff_initial, parsed.backoff_max,
            parsed.retry_after_cap) == (2, 0.05, 1.0, 3.0)


# -- every adapter's booleans ----------------------------------------------------------------

#: (adapter, boolean option, attribute, default)
BOOLEANS = [
    ("vastai", "verified", "verified", True),
    ("salad", "networking_auth", "networking_auth", True),
    ("salad", "check_availability", "check_availability", True),
]


@pytest.mark.parametrize(("kind", "name", "attr", "default"), BOOLEANS)
@pytest.mark.parametrize("value", FALSE_SPELLINGS)
def test_adapter_boolean_false(kind: str, name: str, attr: str, default: bool,
                               value: Any) -> None:
    assert getattr(PARSERS[kind]({name: value}), attr) is False


@pytest.mark.parametrize(("kind", "name", "attr", "default"), BOOLEANS)
@pytest.mark.parametrize("value", TRUE_SPELLINGS)
def test_adapter_boolean_true(kind: str, name: str, attr: str, default: bool,
                              value: Any) -> None:
    assert getattr(PARSERS[kind]({name: value}), attr) is True


@pytest.mark.parametrize(("kind", "name", "attr", "default"), BOOLEANS)
def test_adapter_boolean_default(kind: str, name: str, attr: str, default: bool) -> None:
    assert getattr(PARSERS[kind]({}), attr) is default


@pytest.mark.parametrize(("kind", "name", "attr", "default"), BOOLEANS)
def test_adapter_boolean_refuses_a_word_naming_the_option(kind: str, name: str, attr: str,
                                                          default: bool) -> None:
    with pytest.raises(ValueError, match=rf"^options\.{name}: must be true or false"):
        PARSERS[kind]({name: "maybe"})


# -- every adapter: a non-number names the option ----------------------------------------------

NON_NUMBERS = [
    ("runpod", "disk_gb", "many"),
    ("runpod", "logs_idle_seconds", "soon"),
    ("runpod", "max_attempts", "many"),
    ("runpod", "backoff_max", [1]),
    ("vastai", "disk_gb", "lots"),
    ("vastai", "min_reliability", "high"),
    ("vastai", "offer_limit", [1]),
    ("vastai", "log_poll_interval", "often"),
    ("vastai", "backoff_initial", "fast"),
    ("salad", "default_cpu", "two"),
    ("salad", "storage_gb", {"size": 1}),
    ("salad", "gpu_classes_ttl", "long"),
    ("salad", "retry_after_cap", True),
]


@pytest.mark.parametrize(("kind", "name", "value"), NON_NUMBERS)
def test_adapter_non_number_names_the_option(kind: str, name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^options\.{name}: must be an? "):
        PARSERS[kind]({name: value})


@pytest.mark.parametrize(("kind", "name", "value"), NON_NUMBERS[:1] + NON_NUMBERS[4:5]
                         + NON_NUMBERS[9:10])
def test_the_service_names_the_field_and_option(kind: str, name: str, value: Any) -> None:
    """Through the registry: ``spec.options.<name>: ...`` as GPUProvider statuses show it."""
    options = {**(SALAD_BASE if kind == "salad" else {}), name: value}
    with pytest.raises(ConfigError, match=rf"^spec\.options\.{name}: must be"):
        build_adapter(type_=kind, name="p", url="http://127.0.0.1:1", api_key="k", timeout=5,
                      options=options, owner="node", field="spec")


@pytest.mark.parametrize("kind", sorted(PARSERS))
def test_every_adapter_refuses_unknown_options(kind: str) -> None:
    with pytest.raises(ValueError, match=r"^options: unknown .*option\(s\) bogus; known: "):
        PARSERS[kind]({"bogus": 1})
