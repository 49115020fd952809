"""Where the tests are: ``TESTS`` (tests/), ``REPO`` (the repository root), ``SCRIPTS`` and ``DATA``."""

import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)
SCRIPTS = os.path.join(TESTS, "scripts")
DATA = os.path.join(TESTS, "data")
