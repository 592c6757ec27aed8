"""A bulk pass collects cycles rarely, not never, and leaves the process's setting as it found it."""

import gc

import pytest

from ledger.workers.cycles import COLLECT_AFTER, fewer_cycle_collections


def test_a_bulk_pass_collects_cycles_rarely_and_puts_the_setting_back():
    before = gc.get_threshold()
    with fewer_cycle_collections():
        assert gc.get_threshold() == (max(COLLECT_AFTER, before[0]), *before[1:])
        assert gc.isenabled()
    assert gc.get_threshold() == before


def test_the_setting_is_put_back_after_a_failure():
    before = gc.get_threshold()
    with pytest.raises(ValueError), fewer_cycle_collections():
        raise ValueError("a bad line")
    assert gc.get_threshold() == before
