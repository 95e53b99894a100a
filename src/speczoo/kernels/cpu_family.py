"""Which core design a CPU is, from the vendor, family and model numbers its cpuid reports (/proc/cpuinfo's
"vendor_id", "cpu family" and "model"), so that `speczoo doctor` and every figure can name it: an AMD EPYC
of family 25 is a Zen 3 at model 1 and a Zen 4 at model 17, and "AMD EPYC" alone says neither.

The kernel path is chosen by the instruction sets the CPU executes (kernels/native.py), never by this name:
a tile shaped for one family (a column-half q4 tile for Zen 3, per-family AVX-512 tiles for Zen 4) was
measured and dropped where it did not pay (docs/results.md). This module only names; nothing here runs code.
"""

from __future__ import annotations

# AMD family -> (first model number of a range, its core design), ranges in ascending order (AMD's revision
# guides and the Linux kernel's arch/x86 model tables).
_AMD: dict[int, tuple[tuple[int, str], ...]] = {
    0x17: ((0x00, "Zen"), (0x08, "Zen+"), (0x10, "Zen"), (0x18, "Zen+"), (0x20, "Zen"), (0x30, "Zen 2")),
    0x19: ((0x00, "Zen 3"), (0x10, "Zen 4"), (0x20, "Zen 3"), (0x40, "Zen 3+"), (0x50, "Zen 3"),
           (0x60, "Zen 4")),
    0x1A: ((0x00, "Zen 5"),),
}


def core_design(vendor: str, family: int | None, model: int | None) -> str:
    """"Zen 3", "Zen 4", ... for an AMD CPU of a known family; "" where the numbers name no design known here
    (Intel's family 6 spans a decade of cores by model number alone, so it is left to the model name)."""
    if vendor != "AuthenticAMD" or family not in _AMD or model is None:
        return ""
    name = ""
    for first, design in _AMD[family]:
        if model >= first:
            name = design
    return name


def describe(model_name: str, vendor: str, family: int | None, model: int | None) -> str:
    """One line naming the CPU: "AMD EPYC, Zen 3 (family 25 model 1)", or the model name with its numbers."""
    if family is None:
        return model_name
    design = core_design(vendor, family, model)
    numbers = f"family {family} model {model}"
    return f"{model_name}, {design} ({numbers})" if design else f"{model_name} ({numbers})"
