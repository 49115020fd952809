"""All-pairs (pairwise) covering arrays over named option axes: deterministic, pure, no hypothesis.

A covering array of strength 2 is a list of configurations (one value per
axis) in which every pair of values of two different axes appears together
in at least one configuration.  ``pairwise`` builds one greedily: it
enumerates every configuration of the full product (the axes are small), and
repeatedly takes the first one that covers the most pairs not yet covered.

``allowed`` restricts the configurations that may be chosen; a pair that no
allowed configuration holds is not required (``coverable_pairs``).  ``start``
seeds the array with configurations already chosen, whose pairs count as
covered: a second call can add only what the first left out (the
configurations expected to run, then those expected to be refused).
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterable, Mapping, Sequence

Config = dict
Pair = tuple  # ((axis, value), (axis, value)), axes in the order of ``axes``


def configurations(axes: Mapping[str, Sequence]) -> list[Config]:
    """Every configuration of the product of ``axes``, in product order (the last axis varies fastest)."""
    names = list(axes)
    return [dict(zip(names, values)) for values in itertools.product(*(axes[n] for n in names))]


def pairs_of(config: Config, names: Sequence[str]) -> set[Pair]:
    """The pairs of values that ``config`` holds, over the axes ``names``."""
    return {((a, config[a]), (b, config[b])) for a, b in itertools.combinations(names, 2)}


def coverable_pairs(axes: Mapping[str, Sequence], allowed: Callable[[Config], bool]) -> set[Pair]:
    """Every pair of values that some allowed configuration holds."""
    names = list(axes)
    out: set[Pair] = set()
    for config in configurations(axes):
        if allowed(config):
            out |= pairs_of(config, names)
    return out


def pairwise(axes: Mapping[str, Sequence], allowed: Callable[[Config], bool] = lambda config: True,
             start: Iterable[Config] = ()) -> list[Config]:
    """Allowed configurations, after ``start``, until every coverable pair (``coverable_pairs``) appears.

    Returns only the configurations added (not ``start``).  Deterministic: the
    same axes, predicate and start give the same list.  Each step takes the
    first configuration, in product order, that covers the most pairs still
    uncovered; it stops when none is left.
    """
    names = list(axes)
    candidates = [(c, pairs_of(c, names)) for c in configurations(axes) if allowed(c)]
    uncovered = set().union(*(p for _, p in candidates)) if candidates else set()
    for config in start:
        uncovered -= pairs_of(config, names)
    chosen: list[Config] = []
    while uncovered:
        best, gain = None, 0
        for config, pairs in candidates:
            n = len(pairs & uncovered)
            if n > gain:
                best, gain = (config, pairs), n
        config, pairs = best
        chosen.append(config)
        uncovered -= pairs
    return chosen

