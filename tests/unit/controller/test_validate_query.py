"""Query values: `wait_s` is plain ASCII digits (an optional .fraction) and `ids` a list
of distinct ids with no empty entry; anything else is a 400 naming the parameter."""

from __future__ import annotations

from typing import Any

import pytest

from slurmrl.controller.validate import RpcError, parse_ids, parse_wait
from slurmrl.report import sources


@pytest.mark.parametrize("text", ["1_0", " 5 ", "5\n", "\uff15", "\u0665", "1e2", "0x10",
                                  "+1", "-0", ".5", "5.", "nan", "inf", ""])
def test_a_wait_that_is_not_plain_digits_is_refused_naming_wait_s(text: str) -> None:
    with pytest.raises(RpcError, match="wait_s must be a number of seconds") as err:
        parse_wait(text, 0.0, 300.0)
    assert err.value.status == 400


def test_plain_waits_parse_within_bounds() -> None:
    assert [parse_wait(t, 0.0, 300.0) for t in ("0", "5", "2.5", "300")] == [0.0, 5.0, 2.5,
                                                                            300.0]
    assert parse_wait(None, 7.0, 300.0) == 7.0
    with pytest.raises(RpcError, match="wait_s must be between 0 and 300, got '301'"):
        parse_wait("301", 0.0, 300.0)


@pytest.mark.parametrize(("text", "says"), [
    ("1,,2", "ids: an empty id in '1,,2'"),
    ("1,2,", "ids: an empty id in '1,2,'"),
    (",", "ids: an empty id"),
    ("", "ids: an empty id"),
    ("3,1,3", "ids: 3 is listed twice"),
    ("1, 2", "ids must be a positive integer, got ' 2'"),
])
def test_malformed_id_lists_are_refused_naming_the_entry(text: str, says: str) -> None:
    assert parse_ids("12,13", "ids") == [12, 13]
    with pytest.raises(RpcError, match=says) as err:
        parse_ids(text, "ids")
    assert (err.value.status, err.value.code) == (400, "bad-id")


def test_report_asks_the_controller_for_each_id_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """`slurmrl report -j 3,3` still works: it sends each id once."""
    asked: list[dict[str, str] | None] = []

    class Rpc:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def call(self, method: str, path: str, query: dict[str, str] | None = None,
                 **kwargs: Any) -> tuple[int, dict[str, Any]]:
            asked.append(query)
            return 200, {}

    monkeypatch.setattr("slurmrl.client.rpc.RpcClient", Rpc)
    sources.from_controller("http://ctl:1", [3, 5, 3], 0.0)
    assert asked[0] == {"all": "1", "ids": "3,5"}
