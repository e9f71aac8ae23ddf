"""Numbers in RPC bodies: a JSON integer too large for a float is refused with a 400
naming the field, like any other bad number, never an OverflowError (a 500)."""

from __future__ import annotations

import pytest

from slurmrl.controller.validate import ACQUIRE, RELEASE, F, RpcError, fields, parse_json

HUGE = "1" + "0" * 310  #: a valid JSON integer, beyond a float's range


@pytest.mark.parametrize(("raw", "spec", "says"), [
    ('{"phase": "rollout", "wait_s": %s}', ACQUIRE, "field 'wait_s' must be a finite number"),
    ('{"timing": {"busy_s": %s}}', RELEASE, "field 'timing': 'busy_s' must be a finite number"),
    ('{"started_at": %s}', {"started_at": F("num", True, 0, 2**40)},
     "field 'started_at' must be a finite number"),
    ('{"detail": {"reward": -%s}}', {"detail": F("nummap")},
     "field 'detail': 'reward' must be a finite number"),
])
def test_an_integer_too_large_for_a_float_is_a_400_naming_the_field(
        raw: str, spec: dict[str, F], says: str) -> None:
    with pytest.raises(RpcError, match=says) as err:
        fields(parse_json((raw % HUGE).encode()), spec)
    assert err.value.status == 400 and err.value.code == "bad-value"
    assert "311 digits" in err.value.message


def test_large_integers_a_float_holds_still_parse() -> None:
    assert fields({"detail": {"step": 10**300}}, {"detail": F("nummap")}) == {
        "detail": {"step": 10**300}}
    with pytest.raises(RpcError, match="'wait_s' must be between 0 and 300"):
        fields({"phase": "rollout", "wait_s": 10**300}, ACQUIRE)


@pytest.mark.parametrize(("timing", "code", "says"), [
    ({"state": "held"}, "unknown-field", "field 'timing': unknown key 'state'; accepted: busy_s"),
    ({"busy_s": 1.0, "reason": "x"}, "unknown-field", "unknown key 'reason'"),
    ({"gpu_s": 5.0}, "unknown-field", "unknown key 'gpu_s'"),
    ({"busy_s": -0.5}, "bad-value", "field 'timing': 'busy_s' must be between 0 and 1099511627776"),
    ({"wait_s": float("inf")}, "bad-type", "field 'timing': 'wait_s' must be a finite number"),
])
def test_a_timing_is_the_known_keys_with_seconds_only(
        timing: dict[str, object], code: str, says: str) -> None:
    """The timing is stored beside the lease's own `state` and `reason`: no key of it
    may stand in for those, and its seconds are not negative."""
    assert fields({"timing": {"busy_s": 2, "wait_s": 0.5}}, RELEASE) == {
        "timing": {"busy_s": 2, "wait_s": 0.5}}
    with pytest.raises(RpcError, match=says) as err:
        fields({"timing": timing}, RELEASE)
    assert (err.value.status, err.value.code) == (400, code)


@pytest.mark.parametrize(("value", "code", "says"), [
    ("x" * 5000, "bad-value", "field 'env': 'SLURMRL_NOTE' is longer than 4096 characters"),
    (7, "bad-type", "field 'env': 'SLURMRL_NOTE' must be a string, got an integer"),
])
def test_a_register_env_value_is_refused_for_what_is_wrong_with_it(
        value: object, code: str, says: str) -> None:
    # a long SLURMRL_* variable of the job's (connect() sends them all) read
    # "must be a string"
    spec = {"env": F("strmap", True)}
    with pytest.raises(RpcError, match=says) as err:
        fields({"env": {"SLURMRL_GPUS": "2", "SLURMRL_NOTE": value}}, spec)
    assert err.value.status == 400 and err.value.code == code
