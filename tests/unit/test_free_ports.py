"""Ports for local children: several choosers side by side (test workers) take theirs
from shares of the range that never overlap."""

from __future__ import annotations

import itertools

import pytest

from services.dev import processes


def test_the_shares_split_the_range_without_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = processes._below_ephemeral_range()
    shares = []
    for index in range(3):
        monkeypatch.setenv(processes.PORT_SHARE_VARIABLE, f"{index}/3")
        shares.append(processes._port_range())
    for (_, high), (low, _) in itertools.pairwise(shares):
        assert high < low
    assert shares[0][0] == whole[0] and shares[-1][1] <= whole[1]


def test_a_port_comes_from_the_choosers_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(processes.PORT_SHARE_VARIABLE, "1/3")
    low, high = processes._port_range()
    assert all(low <= processes.free_port() <= high for _ in range(20))


def test_without_a_share_the_whole_range_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(processes.PORT_SHARE_VARIABLE, raising=False)
    assert processes._port_range() == processes._below_ephemeral_range()


def test_a_sub_share_lies_inside_its_share_apart_from_its_siblings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(processes.PORT_SHARE_VARIABLE, "1/3")
    outer = processes._port_range()
    parts = []
    for slot in range(3):
        monkeypatch.setenv(processes.PORT_SHARE_VARIABLE, processes.sub_share("1/3", slot, 3))
        parts.append(processes._port_range())
    for (_, high), (low, _) in itertools.pairwise(parts):
        assert high < low
    assert outer[0] <= parts[0][0] and parts[-1][1] <= outer[1]
    assert processes.sub_share(None, 2, 3) == "2/3"
