"""Devices for splitting a model: parsing declared device specs (profiles, memory caps, links),
size units, malformed specs and unknown targets, bare target names and detection."""

from __future__ import annotations

import pytest

from graphopt.decisions.memory_runtime.memory import usable_memory
from graphopt.errors import GraphoptError, UnknownTargetError
from graphopt.hardware import get_target
from graphopt.partition import detect_devices, parse_devices, parse_size

# --- devices -------------------------------------------------------------------------------

def test_parse_declared_devices_profiles_caps_and_links():
    ds = parse_devices("cuda:0=h100,cuda:1=a100:40GB,cpu:4GB")
    names = [d.name for d in ds.devices]
    assert names == ["cuda:0", "cuda:1", "cpu"]
    h100, a100, cpu = ds.devices
    # a100:40GB is the A100 40GB (its own bandwidth), not the 80 GB card capped
    assert h100.profile.name == "h100-sxm" and a100.profile.name == "a100-40gb"
    assert cpu.profile is get_target("cpu")
    assert h100.memory_bytes == usable_memory(h100.profile)  # no cap: the reserve policy
    assert a100.memory_bytes == min(40 * 10**9, usable_memory(a100.profile))
    assert cpu.memory_bytes == min(4 * 10**9, usable_memory(cpu.profile))
    assert ds.link("cuda:0", "cuda:1").name.startswith("nvlink")  # both have NVLink
    assert ds.link("cuda:0", "cpu").name.startswith("pcie")
    assert ds.link("cpu", "cuda:1").name.startswith("pcie")
    assert len(ds.links) == 6  # every ordered pair
    assert ds.transfer_time_s(1e9, "cuda:0", "cuda:0") == 0.0
    nv = ds.transfer_time_s(1e9, "cuda:0", "cuda:1")
    assert nv < ds.transfer_time_s(1e9, "cuda:1", "cpu")  # NVLink beats PCIe


@pytest.mark.parametrize("spec, profile, capped", [
    ("cuda:0=a100:40GB", "a100-40gb", False), ("cuda:0=a100:40GiB", "a100-40gb", False),
    ("a100:40GB", "a100-40gb", False), ("cuda:0=a100:80GB", "a100-80gb", False),
    ("cuda:0=a100-80gb:40GB", "a100-80gb", True),  # the named card, capped
    ("cuda:0=a100:30GB", "a100-80gb", True),  # no 30 GB A100: the flagship, capped
    ("cuda:0=h100:40GB", "h100-sxm", True)])
def test_a_family_with_a_memory_names_that_card(spec: str, profile: str, capped: bool) -> None:
    device = parse_devices(spec).devices[0]
    assert device.profile.name == profile
    assert (device.memory_bytes < usable_memory(device.profile)) == capped


def test_two_cards_of_one_model_get_a_real_link():
    # one profile object for both: the link must still be NVLink, not "local"
    ds = parse_devices("cuda:0=h100,cuda:1=h100")
    assert ds.link("cuda:0", "cuda:1").name == "nvlink4"
    pcie = parse_devices("cuda:0=rtx-4090,cuda:1=rtx-4090")  # no peer link: via the host
    link = pcie.link("cuda:0", "cuda:1")
    assert link.name == "pcie4-x16+pcie4-x16" and link.latency_s > 0


@pytest.mark.parametrize("text, expected", [
    ("40GB", 40 * 10**9), ("40GiB", 40 * 2**30), ("512MiB", 512 * 2**20), ("1.5TB", 1.5e12),
    ("40gb", 40 * 10**9), ("64 GB", 64 * 10**9)])
def test_parse_size_units(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("spec", [
    "", " , ", "cuda:0=", "=h100", "cuda:0=h100:abc", "cuda:0=h100,cuda:0=a100",
    "cuda:0=h100:40", "cuda:0=h100:40XB"])
def test_malformed_device_specs_say_how_to_fix(spec):
    with pytest.raises(GraphoptError) as err:
        parse_devices(spec)
    assert err.value.fix


def test_cap_larger_than_the_device_is_refused():
    with pytest.raises(GraphoptError, match="larger than"):
        parse_devices("cuda:0=h100:100GB")


def test_unknown_target_uses_the_registry_error():
    with pytest.raises(UnknownTargetError):
        parse_devices("cuda:0=h999")


def test_bare_target_names_and_detection():
    ds = parse_devices("h100,a100")
    assert [d.profile.name for d in ds.devices] == ["h100-sxm", "a100-80gb"]
    detected = detect_devices()
    assert detected.devices[-1].name == "cpu"  # the host is always there
