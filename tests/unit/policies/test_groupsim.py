"""The pairing predictor's fast group simulation agrees with the real LeaseTable."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.groupsim import TAIL, SimKey, simulate_group, simulate_group_table
from slurmrl.model import Phase

PHASES = [*(p.value for p in (Phase.ROLLOUT, Phase.TRAIN, Phase.SYNC, Phase.REWARD, Phase.IDLE)),
          TAIL]


@st.composite
def groups(draw: st.DrawFn) -> list[SimKey]:
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    n = draw(st.integers(2, 3))
    out: list[SimKey] = []
    for _ in range(n):
        rg = 0 if gpus == 1 else draw(st.integers(0, gpus - 1))
        step = draw(st.lists(st.tuples(st.sampled_from(PHASES),
                                       st.sampled_from([0.0, 1.0, 2.5, 10.0, 33.0, 50.0, 1e-12])),
                             min_size=1, max_size=6))
        out.append((rg, gpus, tuple(step)))
    return out


@settings(max_examples=150, deadline=None)
@given(groups())
def test_fast_group_simulation_matches_the_lease_table(members: list[SimKey]) -> None:
    assert simulate_group(members) == simulate_group_table(members)


def test_two_jobs_that_both_need_the_set_all_the_time_slow_each_other_down() -> None:
    busy: SimKey = (0, 8, (("rollout", 10.0), ("train", 10.0)))
    s = simulate_group([busy, busy])
    assert min(s) > 1.5
    gap_a: SimKey = (0, 8, (("rollout", 10.0), ("reward", 10.0)))
    gap_b: SimKey = (0, 8, (("reward", 10.0), ("train", 10.0)))
    assert simulate_group([gap_a, gap_b]) == (1.0, 1.0)
