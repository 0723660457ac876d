"""The installed pytest-xdist is one that tests/conftest.py's scheduler was checked against.

The default run's scheduler (tests/xdist_units.py, made by tests/conftest.py) overrides
xdist's private ``_split_scope`` so that each test file, and tests/conformance as a whole, is
one unit of work. A release that renamed the method, or stopped calling it, would spread a
file's tests over both workers (module-scoped servers started twice, the conformance
coverage check skipped): the conftest stops the run then, and this test fails as soon as an
xdist outside the checked range is installed, so that an upgrade is a decision.
"""

from __future__ import annotations

from xdist_units import XDIST_CHECKED, xdist_scope_problem

from .checked_ranges import assert_bounded_and_installed


def test_the_declared_xdist_range_is_bounded_above_and_admits_the_installed_one():
    assert_bounded_and_installed("pytest-xdist", f"tests/xdist_units.py's scheduler was checked against "
                                 f"{XDIST_CHECKED}: re-check it, then widen both", extra="test")


def test_the_private_scope_api_the_scheduler_overrides_is_there():
    assert xdist_scope_problem() is None
