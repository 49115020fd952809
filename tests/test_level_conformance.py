"""hpcckpt.testing.LevelTests for the built-in redundancy levels (issue 18); run under mpiexec -n 2, 3, 4."""

from __future__ import annotations

import pytest

from hpcckpt.levels.parity import ParityLevel
from hpcckpt.levels.partner import PartnerLevel
from hpcckpt.testing import LevelTests

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class TestPartner(LevelTests):
    level = PartnerLevel()
    options = {"partner_every": 1}


class TestParity(LevelTests):
    level = ParityLevel()
    options = {"parity_every": 1, "parity_group": 4}
