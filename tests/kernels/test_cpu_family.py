"""The CPU's core design named from cpuid's numbers (kernels/cpu_family.py), as `speczoo doctor` shows it."""

import pytest

from speczoo.kernels import native
from speczoo.kernels.cpu_family import core_design, describe

# /proc/cpuinfo of one core of an AMD EPYC 7B13 (Milan), as Linux prints it
MILAN = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC 7B13\n"
         "stepping\t: 1\nphysical id\t: 0\ncore id\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")


@pytest.mark.parametrize("family,model,design", [
    (23, 1, "Zen"), (23, 8, "Zen+"), (23, 17, "Zen"), (23, 24, "Zen+"), (23, 49, "Zen 2"), (23, 113, "Zen 2"),
    (25, 1, "Zen 3"), (25, 17, "Zen 4"), (25, 33, "Zen 3"), (25, 68, "Zen 3+"), (25, 80, "Zen 3"),
    (25, 97, "Zen 4"), (25, 116, "Zen 4"), (26, 2, "Zen 5")])
def test_amd_families_and_models_name_their_core_design(family, model, design):
    assert core_design("AuthenticAMD", family, model) == design


def test_numbers_no_design_is_known_for_are_left_unnamed():
    assert core_design("GenuineIntel", 6, 143) == ""
    assert core_design("AuthenticAMD", 21, 2) == ""          # Bulldozer's family: no table here
    assert core_design("AuthenticAMD", 25, None) == ""
    assert describe("Intel Xeon", "GenuineIntel", 6, 143) == "Intel Xeon (family 6 model 143)"
    assert describe("Arm CPU part 0xd0c", "", None, None) == "Arm CPU part 0xd0c"


def test_cpuinfo_gives_the_numbers_and_the_name_carries_them():
    info = native.parse_cpuinfo(MILAN + MILAN.replace("processor\t: 0", "processor\t: 1"), "x86_64")
    assert (info.vendor, info.family, info.model_number, info.model) == ("AuthenticAMD", 25, 1, "AMD EPYC 7B13")
    assert info.describe() == "AMD EPYC 7B13, Zen 3 (family 25 model 1)"
