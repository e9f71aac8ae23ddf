"""`policies.registry.load`: a bad name, parameter or class is one clear error, whoever
asks (the site config's check, the controller, `slurmrl doctor`, `slurmrl simulate`)."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from policies import registry


@pytest.mark.parametrize(
    ("kind", "name", "params", "says"),
    [
        ("slice", "round-robin", {"x": 1}, "no parameter 'x' (it takes: none)"),
        ("admission", "site-limits", {"max_slowdown": 2.0},
         "no parameter 'max_slowdown' (it takes: gpu_mem_bytes, partitions)"),
        ("pairing", "complementary", {"nosuch": 1},
         "no parameter 'nosuch' (it takes: margin, min_gain, max_group, single, neighbours, "
         "stagger, open_staggered, max_load, max_load_when, floating, floating_members)"),
    ],
)
def test_an_unknown_parameter_names_the_ones_the_policy_takes(
    kind: str, name: str, params: dict[str, Any], says: str,
) -> None:
    with pytest.raises(registry.UnknownPolicy) as info:
        registry.load(kind, name, params)
    assert f"{kind} policy {name!r}: bad parameters: {says}" == str(info.value)


@pytest.mark.parametrize(
    ("kind", "name", "key", "value", "says"),
    [
        ("pairing", "complementary", "min_gain", "abc", "must be a float, got 'abc'"),
        ("pairing", "complementary", "max_load", "abc", "must be a float, got 'abc'"),
        ("pairing", "complementary", "max_load", True, "must be a float, got true"),
        ("pairing", "complementary", "max_load", [1, 2], "must be a float, got [1, 2]"),
        ("pairing", "complementary", "stagger", "abc", "must be an integer, got 'abc'"),
        ("pairing", "complementary", "neighbours", "abc", "must be an integer, got 'abc'"),
        ("pairing", "complementary", "max_group", 2.5, "must be an integer, got 2.5"),
        ("pairing", "complementary", "max_group", True, "must be an integer, got true"),
        ("pairing", "complementary", "open_staggered", "maybe",
         "must be true or false, got 'maybe'"),
        ("pairing", "complementary", "single", 1, "must be a string, got 1"),
        ("pairing", "complementary", "margin", float("nan"), "must be a finite number, got nan"),
        ("pairing", "complementary", "max_load", float("inf"),
         "must be a finite number, got inf"),
        ("pairing", "gang", "quantum_s", "abc", "must be a float, got 'abc'"),
        ("slice", "bounded-slowdown", "default_max_slowdown", "abc",
         "must be a float, got 'abc'"),
        ("admission", "site-limits", "partitions", [1], "must be a list of strings, got [1]"),
        ("admission", "site-limits", "gpu_mem_bytes", "80G", "must be an integer, got '80G'"),
    ],
)
def test_a_value_of_the_wrong_type_names_the_parameter_and_the_type(
    kind: str, name: str, key: str, value: object, says: str,
) -> None:
    with pytest.raises(registry.UnknownPolicy) as info:
        registry.load(kind, name, {key: value})
    assert str(info.value) == f"{kind} policy {name!r}: bad parameters: parameter {key!r} {says}"


def test_an_integer_passes_for_a_float_and_none_for_an_optional_one_a_bool_for_neither() -> None:
    pol = registry.load("pairing", "complementary",
                        {"max_load": 1, "margin": 1, "min_gain": 0, "max_group": 2})
    assert (pol.max_load, pol.margin, pol.min_gain, pol.max_group) == (1, 1, 0, 2)
    assert registry.load("pairing", "complementary", {"max_load": None}).max_load is None
    adm = registry.load("admission", "site-limits", {"partitions": ["pools", "a100"]})
    assert adm.partitions == ("pools", "a100")
    with pytest.raises(registry.UnknownPolicy, match="'margin' must be a float, got false"):
        registry.load("pairing", "complementary", {"margin": False})


@pytest.mark.parametrize(
    ("kind", "name", "params", "says"),
    [
        ("pairing", "complementary", {"neighbours": 0}, "neighbours must be >= 1, got 0"),
        ("pairing", "complementary", {"neighbours": -1}, "neighbours must be >= 1, got -1"),
        ("pairing", "random", {"max_group": 0}, "max_group must be >= 1, got 0"),
        ("pairing", "greedy", {"max_group": 0}, "max_group must be >= 1, got 0"),
        ("pairing", "greedy", {"max_duty": -5}, "max_duty must be a finite number > 0, got -5"),
        ("pairing", "greedy", {"max_duty": 0.0}, "max_duty must be a finite number > 0, got 0.0"),
        ("pairing", "gang", {"gpu_mem_bytes": 0}, "gpu_mem_bytes must be >= 1, got 0"),
        ("admission", "site-limits", {"gpu_mem_bytes": -1}, "gpu_mem_bytes must be >= 1, got -1"),
        # an empty list would refuse every job, naming no valid partition
        ("admission", "site-limits", {"partitions": []}, "partitions must list at least one "
         "partition name (leave it out to allow any), got []"),
        ("admission", "site-limits", {"partitions": ["pools", " "]}, "partitions must list "
         "at least one partition name (leave it out to allow any), got ['pools', ' ']"),
    ],
)
def test_out_of_range_values_are_refused_by_the_constructor(
    kind: str, name: str, params: dict[str, Any], says: str,
) -> None:
    with pytest.raises(registry.UnknownPolicy) as info:
        registry.load(kind, name, params)
    assert str(info.value) == f"{kind} policy {name!r}: bad parameters: {says}"


@pytest.mark.parametrize(
    ("kind", "name", "says"),
    [
        ("pairing", "collections:OrderedDict",
         "the OrderedDict it builds has no name, mode, place()"),
        ("slice", "os:getcwd", "the str it builds has no name, order()"),
        ("admission", "policies.pairing_default:ComplementaryPairing",
         "the ComplementaryPairing it builds has no admit()"),
    ],
)
def test_a_class_that_is_not_a_policy_of_its_kind_is_refused(
    kind: str, name: str, says: str,
) -> None:
    with pytest.raises(registry.UnknownPolicy) as info:
        registry.load(kind, name)
    assert f"{kind} policy {name!r} is not a {kind} policy: {says}" in str(info.value)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--param", "complementary.min_gain=abc"],
         "pairing policy 'complementary': bad parameters: parameter 'min_gain' must be a "
         "float, got 'abc'"),
        (["--param", "round-robin.x=1"],
         "slice policy 'round-robin': bad parameters: no parameter 'x' (it takes: none)"),
        (["--pairing", "collections:OrderedDict"],
         "pairing policy 'collections:OrderedDict' is not a pairing policy"),
    ],
)
def test_simulate_refuses_them_in_one_line(args: list[str], says: str) -> None:
    from slurmrl.sim.cli import simulate

    res = CliRunner().invoke(simulate, ["--jobs", "2", *args])
    assert res.exit_code == 1, res.output
    assert isinstance(res.exception, SystemExit)  # its own exit, not an exception
    assert res.output.startswith(f"slurmrl simulate: {says}"), res.output


@pytest.mark.parametrize(("code", "says"), [
    ("raise RuntimeError('no licence server')\n",
     "slice policy 'brokensite:Slice' cannot be imported: RuntimeError: no licence server"),
    ("class Slice:\n    def __init__(self):\n        raise KeyError('cluster')\n",
     "slice policy 'brokensite:Slice' cannot be built: KeyError: 'cluster'"),
])
def test_a_site_policy_that_raises_is_refused_by_name(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, code: str, says: str) -> None:
    # any exception of a site's module or constructor (the controller and doctor read
    # only UnknownPolicy; anything else was a traceback that stopped every check)
    (tmp_path / "brokensite.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "brokensite", raising=False)
    with pytest.raises(registry.UnknownPolicy) as err:
        registry.load("slice", "brokensite:Slice")
    assert str(err.value).startswith(says)


def test_site_limits_partitions_fall_back_to_the_pool_partition_where_no_submit_one() -> None:
    from policies.base import JobSnapshot, SiteLimits, Verdict
    from slurmrl.model import RlRequest

    adm = registry.load("admission", "site-limits", {"partitions": ["pools"]})
    sim_job = JobSnapshot(1, "u", RlRequest(gpus=1), None, 0.0, "pools")
    assert adm.admit(sim_job, SiteLimits()).verdict is Verdict.ACCEPT
    from_drivers = JobSnapshot(2, "u", RlRequest(gpus=1), None, 0.0, "pools",
                               submit_partition="drivers")
    verdict = adm.admit(from_drivers, SiteLimits())
    assert verdict.verdict is Verdict.REJECT and "'drivers'" in verdict.reason


def _site_module(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, name: str, code: str) -> None:
    (tmp_path / f"{name}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, name, raising=False)


_MODES = '''
from policies.base import Action, Placement

class Mode:
    name = "mode"

    def __init__(self, mode: object = "lease") -> None:
        self.mode = mode

    def place(self, snapshot):
        return [Placement(j.job_id, Action.DEDICATED, gpus=j.request.gpus)
                for j in snapshot.waiting]
'''


def test_a_pairing_policys_mode_given_as_a_string_is_taken_as_its_member(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # the callers compare modes by identity: "lease" ran as whole-pool locks in the
    # simulator, and the controller refused it as "forms lease pools"
    from policies.base import PoolMode

    _site_module(tmp_path, monkeypatch, "sitemodes", _MODES)
    assert registry.load("pairing", "sitemodes:Mode").mode is PoolMode.LEASE
    assert registry.load("pairing", "sitemodes:Mode", {"mode": "gang"}).mode is PoolMode.GANG
    with pytest.raises(registry.UnknownPolicy) as err:
        registry.load("pairing", "sitemodes:Mode", {"mode": "leases"})
    assert str(err.value) == ("pairing policy 'sitemodes:Mode': mode 'leases' is not a pool "
                              "mode; valid: PoolMode.LEASE, PoolMode.LOCK, PoolMode.GANG "
                              "(policies/base.py)")


_TYPE_CHECKING_ONLY = '''
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slurmrl.leases.types import PoolView

class Slice:
    name = "slice"

    def __init__(self, max_skips: int = 4, hint: PoolView | None = None) -> None:
        self.max_skips, self.hint = max_skips, hint

    def order(self, view):
        return list(view.waiting)
'''


@pytest.mark.parametrize(("value", "shown"), [(True, "true"), (2.5, "2.5"), ("2", "'2'")])
def test_an_annotation_that_does_not_resolve_leaves_the_others_checked(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, value: object, shown: str) -> None:
    # a name imported only for type checkers (`hint`) left every parameter unchecked
    _site_module(tmp_path, monkeypatch, "sitehints", _TYPE_CHECKING_ONLY)
    with pytest.raises(registry.UnknownPolicy) as err:
        registry.load("slice", "sitehints:Slice", {"max_skips": value})
    assert str(err.value) == ("slice policy 'sitehints:Slice': bad parameters: parameter "
                              f"'max_skips' must be an integer, got {shown}")
    # the one it cannot resolve goes to the constructor as given
    assert registry.load("slice", "sitehints:Slice", {"hint": 3, "max_skips": 2}).hint == 3
