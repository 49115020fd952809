"""hpcckpt.testing.LevelTests for the built-in redundancy levels; run under mpiexec -n 2, 3, 4."""

from __future__ import annotations

import pytest

from hpcckpt.levels.parity import ParityLevel
from hpcckpt.levels.partner import PartnerLevel
from hpcckpt.levels.rs import ReedSolomonLevel
from hpcckpt.testing import LevelTests

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class TestPartner(LevelTests):
    level = PartnerLevel()
    options = {"partner_every": 1}


class TestParity(LevelTests):
    level = ParityLevel()
    options = {"parity_every": 1, "parity_group": 4}


class TestReedSolomon(LevelTests):
    level = ReedSolomonLevel()
    options = {"rs_every": 1, "rs_group": (1, 1)}  # groups of 2 or more at every rank count; m > 1: test_rs_levels
