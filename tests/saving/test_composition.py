"""The all-pairs generator (tests/support/pairwise.py) and the composition matrix built with it (tests/support/composition.py).

Pure, no MPI; the matrix itself runs under mpiexec in tests/saving/test_composition_mpi.py.
"""

from __future__ import annotations

import itertools

import pytest

from composition import AXES, CONFIGS, possible
from pairwise import configurations, coverable_pairs, pairs_of, pairwise

EXAMPLES = [
    {"a": (0, 1)},
    {"a": (0, 1), "b": ("x",)},
    {"a": (0, 1), "b": (0, 1), "c": (0, 1)},
    {"a": tuple(range(5)), "b": tuple(range(4)), "c": (False, True), "d": ("p", "q", "r")},
    {"a": tuple(range(6)), "b": tuple(range(5)), "c": (0, 1), "d": (0, 1), "e": (0, 1, 2), "f": (0, 1)},
]


def _every_pair_appears(axes, configs, allowed):
    want = coverable_pairs(axes, allowed)
    got = set().union(*(pairs_of(c, list(axes)) for c in configs)) if configs else set()
    return want <= got


def _brute_pairs(axes, allowed):
    """The pairs some allowed configuration holds, computed without the module's helpers."""
    names = list(axes)
    out = set()
    for values in itertools.product(*axes.values()):
        c = dict(zip(names, values))
        if allowed(c):
            for i, j in itertools.combinations(range(len(names)), 2):
                out.add(((names[i], values[i]), (names[j], values[j])))
    return out


@pytest.mark.parametrize("axes", EXAMPLES)
def test_every_pair_of_values_appears_in_some_configuration(axes):
    configs = pairwise(axes)
    assert _every_pair_appears(axes, configs, lambda c: True)
    want = _brute_pairs(axes, lambda c: True)
    assert want == coverable_pairs(axes, lambda c: True)
    if len(axes) >= 2:  # at least the product of the two largest axes, at most the whole product
        sizes = sorted(map(len, axes.values()))
        assert sizes[-1] * sizes[-2] <= len(configs) <= len(configurations(axes))


def test_the_array_is_small_and_deterministic():
    axes = EXAMPLES[-1]
    configs = pairwise(axes)
    assert configs == pairwise(axes)
    assert len(configs) <= 36  # 6 x 5 is the lower bound; the whole product is 720
    assert len({tuple(c.values()) for c in configs}) == len(configs)


def test_a_forbidden_pair_never_appears_and_every_other_does():
    axes = EXAMPLES[3]
    allowed = lambda c: not (c["c"] and c["a"] == 0) and not (c["b"] == 3 and c["d"] == "r")  # noqa: E731
    configs = pairwise(axes, allowed)
    assert all(allowed(c) for c in configs)
    assert _every_pair_appears(axes, configs, allowed)
    pairs = set().union(*(pairs_of(c, list(axes)) for c in configs))
    assert (("a", 0), ("c", True)) not in pairs and (("b", 3), ("d", "r")) not in pairs
    assert coverable_pairs(axes, allowed) == _brute_pairs(axes, allowed)


def test_a_second_call_adds_only_what_the_first_left_out():
    axes = EXAMPLES[3]
    narrow = lambda c: not c["c"]  # noqa: E731
    first = pairwise(axes, narrow)
    more = pairwise(axes, start=first)
    assert all(not c["c"] for c in first)
    assert all(c["c"] for c in more)  # every pair without c=True was covered by the first call
    assert _every_pair_appears(axes, first + more, lambda c: True)
    assert not _every_pair_appears(axes, first, lambda c: True)
    assert pairwise(axes, start=first + more) == []


def test_nothing_allowed_gives_nothing():
    assert pairwise(EXAMPLES[2], lambda c: False) == []


# ------------------------------------------------------------------ the composition matrix (tests/support/composition.py)
def _held(configs):
    return set().union(*(pairs_of(c, list(AXES)) for c in configs))


def test_the_matrix_holds_every_possible_pair_and_only_possible_configurations():
    assert coverable_pairs(AXES, possible) <= _held(CONFIGS)
    assert all(possible(c) for c in CONFIGS)
    assert len({tuple(c.values()) for c in CONFIGS}) == len(CONFIGS)
    # each level with each codec: 30 at least
    assert len(CONFIGS) <= 40


def test_the_only_impossible_pair_is_precopy_with_full_versions():
    impossible = _held(configurations(AXES)) - coverable_pairs(AXES, possible)
    assert impossible == {(("kind", "full"), ("precopy", True))}

