"""Weight quantizers and the packed layouts the CPU kernels read (q8: int8, q4: 4-bit super-blocks).

`pack_q8` / `pack_q4` turn an fp32 weight [N, K] into the tensors the kernels stream (see the layout
comment at the top of cpu_kernels.cpp); `unpack_q8` / `unpack_q4` give back the integer codes and
scales in plain [N, K] order for the PyTorch reference path and for error reports. Everything here is
deterministic (same weight in, same bytes out, whatever the thread count or the row chunking) because
packed tensors are stored in bundles at pull time: a faster packer must give the same bytes as the one it
replaces (tests/pack_oracle.py keeps the replaced ones). Rows are packed independently, in chunks whose
temporaries stay in cache. This module must never run a matmul or choose a backend.

q4 format: super-blocks of 256 inputs, 8 groups of 32; w = D * sc_g * q - Dm * m_g with q in [0, 15],
sc_g and m_g uint8, D and Dm fp32 per (column, super-block): 4.75 bits per weight. It holds llama.cpp's
Q4_K exactly (6-bit sc and m are a subset), so a weight dequantized from a Q4_K GGUF repacks with only
fp32 rounding error; other weights get a small search over clipping and sub-scale rounding. A K that is
not a multiple of 256 (the 0.5B's 896) ends in a partial super-block of `q4_groups(K)` groups in all:
the packing stores no all-zero padding groups, which the kernels would otherwise stream at every step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

# The packed layouts' version, stamped into every stored packing ("layout" in its metadata) so that a
# speczoo older than the file refuses it instead of reading it wrongly (speczoos from layout 2 on check;
# earlier ones did not). 1: q4 padded K to 256 (no stamp); 2: q4 ends in a partial super-block
# (q4_groups). Loading accepts every layout up to this one; change the number with the layout.
PACK_LAYOUT = 2
STRIP = 16        # output columns per kernel strip (one zmm of int32 accumulators)
SUPER = 256       # q4 super-block length along K
GROUP = 32        # q4 group length along K
ABLOCK = 256      # activation inputs per int8 scale in the kernels (a q4 super-block; cpu_kernels.h SZ_ABLOCK)
Q8_KALIGN = 32    # q8 pads K to a multiple of this (one register block of 8 x 4 inputs)
_Q4_CHUNK = 1 << 17  # weights the q4 search takes at a time, in whole rows (its temporaries stay in cache)
_Q8_ROW_CHUNK = 512  # rows pack_q8 quantizes at a time (its temporaries stay in cache)


def _check_shape(weight: Tensor) -> Tensor:
    if weight.dim() != 2 or weight.shape[0] == 0 or weight.shape[1] == 0:
        raise ValueError(f"a linear weight must be 2-D [N, K] with N, K > 0, got shape {tuple(weight.shape)}")
    return weight.detach().float().contiguous()


def _check_finite(ok: bool) -> None:
    if not ok:
        raise ValueError("the weight has NaN or inf values; quantizing it would hide that, fix the source")


def _check_weight(weight: Tensor) -> Tensor:
    w = _check_shape(weight)
    _check_finite(bool(torch.isfinite(w).all()))
    return w


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def padded_rows(w: Tensor, width: int, chunk: int) -> Iterator[tuple[int, int, Tensor]]:
    """The rows of an fp32 weight [N, K] `chunk` at a time, as a quantizer reads them: (r0, r1, rows), rows a new
    fp32 [r1 - r0, width] holding w[r0:r1] with zeros past column K (width >= K)."""
    n, k = w.shape
    for r0 in range(0, n, chunk):
        r1 = min(n, r0 + chunk)
        rows = torch.zeros(r1 - r0, width, dtype=torch.float32)
        rows[:, :k] = w[r0:r1]
        yield r0, r1, rows


def _meta(n: int, k: int) -> Tensor:
    return torch.tensor([n, k], dtype=torch.int64)


# ------------------------------------------------------------------------------------------ q8
def quantize_q8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-output-column int8: returns q int8 [N, K] in [-127, 127] and scale fp32 [N]."""
    w = _check_weight(weight)                                   # [N, K]
    scale = w.abs().amax(dim=1) / 127.0                         # [N]
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / safe[:, None]).clamp_(-127, 127)
    q = torch.where(scale[:, None] > 0, q, torch.zeros_like(q)).to(torch.int8)
    return q, scale


class Rows:
    """A weight [N, K] read a block of rows at a time: `read(r0, r1)` gives fp32 rows [r1 - r0, K]. A packer
    that takes Rows never holds the whole fp32 weight (a GGUF tensor is decoded chunk by chunk, in cache)."""

    def __init__(self, shape: tuple[int, int], read: Callable[[int, int], Tensor]):
        if len(shape) != 2 or shape[0] <= 0 or shape[1] <= 0:
            raise ValueError(f"a linear weight must be 2-D [N, K] with N, K > 0, got shape {tuple(shape)}")
        self.shape = (int(shape[0]), int(shape[1]))
        self.read = read

    @classmethod
    def of(cls, weight: Tensor | Rows) -> Rows:
        if isinstance(weight, Rows):
            return weight
        w = _check_shape(weight)
        return cls(tuple(w.shape), lambda r0, r1: w[r0:r1])


@dataclass
class WeightError:
    """Running sums for a packing's relative weight error ||packed - w|| / ||w|| over any number of weights:
    the squared norms in fp64 (each chunk's sum taken in fp32, ample for a figure of a few digits)."""

    err2: float = 0.0
    ref2: float = 0.0

    def add(self, approx: Tensor, ref: Tensor) -> None:
        self.err2 += float(torch.linalg.vector_norm(approx - ref)) ** 2
        self.ref2 += float(torch.linalg.vector_norm(ref)) ** 2

    def merge(self, other: WeightError) -> None:
        self.err2 += other.err2
        self.ref2 += other.ref2

    @property
    def relative(self) -> float:
        return (self.err2 / self.ref2) ** 0.5 if self.ref2 > 0 else (0.0 if self.err2 == 0 else float("inf"))


def pack_q8(weight: Tensor | Rows, error: WeightError | None = None) -> dict[str, Tensor]:
    """{"w8": u8 [NB, KP/4, 16, 4] (q + 128), "sw": f32 [NB*16], "meta": i64 [N, K]}: quantize_q8's codes.

    Cheap enough to run at load (a tied LM head is packed then, kernels/linear.py `cheap_pack`): rows go
    through in cache-sized chunks (read from `weight` one chunk at a time when it is Rows) and the codes
    are written straight as q + 128 in uint8. The padding is code 0 (128), as is every code of an all-zero
    row (its scale is 0 and w / 1 rounds to 0). `error` (when given) gets the sums of q * scale against w.
    """
    rows = Rows.of(weight)
    n, k = rows.shape
    np_, kp = _round_up(n, STRIP), _round_up(k, Q8_KALIGN)
    w8 = torch.full((np_, kp), 128, dtype=torch.uint8)          # [NP, KP]
    sw = torch.zeros(np_, dtype=torch.float32)                  # [NP]
    for r0 in range(0, n, _Q8_ROW_CHUNK):
        r1 = min(n, r0 + _Q8_ROW_CHUNK)
        w = rows.read(r0, r1)                                   # [R, K] fp32
        amax = w.abs().amax(dim=1)                              # [R]; NaN or inf when a value is (max propagates NaN)
        _check_finite(bool(torch.isfinite(amax).all()))
        scale = amax / 127.0
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = (w / safe[:, None]).round_().clamp_(-127, 127)      # [R, K] integer values
        if error is not None:
            error.add(q * scale[:, None], w)
        w8[r0:r1, :k] = q.add_(128)
        sw[r0:r1] = scale
    w8 = w8.view(np_ // STRIP, STRIP, kp // 4, 4).permute(0, 2, 1, 3).contiguous()
    return {"w8": w8, "sw": sw, "meta": _meta(n, k)}


def unpack_q8(packed: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Inverse layout of pack_q8: q int8 [N, K], scale fp32 [N]."""
    n, k = (int(v) for v in packed["meta"])
    w8 = packed["w8"]                                           # [NB, KP/4, 16, 4]
    nb, kq = w8.shape[0], w8.shape[1]
    q = (w8.permute(0, 2, 1, 3).reshape(nb * STRIP, kq * 4).to(torch.int16) - 128).to(torch.int8)
    return q[:n, :k].contiguous(), packed["sw"][:n].clone()


# ------------------------------------------------------------------------------------------ q4
@dataclass
class Q4Codes:
    """q4 in plain order: w[n, k] = d[n, b] * sc[n, g] * q[n, k] - dm[n, b] * m[n, g], g = k // 32, b = k // 256."""

    q: Tensor    # [N, KP] uint8 in [0, 15]
    sc: Tensor   # [N, KP/32] uint8
    m: Tensor    # [N, KP/32] uint8
    d: Tensor    # [N, KP/256] fp32
    dm: Tensor   # [N, KP/256] fp32

    def dequantize(self) -> Tensor:  # -> [N, KP] fp32
        n, kp = self.q.shape
        a = (self.d[:, :, None] * self.sc.view(n, -1, 8).float()).reshape(n, -1)        # [N, G]
        b = (self.dm[:, :, None] * self.m.view(n, -1, 8).float()).reshape(n, -1)        # [N, G]
        q = self.q.view(n, -1, GROUP).float()
        return (a[:, :, None] * q - b[:, :, None]).reshape(n, kp)


def _codes(wb: Tensor, a: Tensor) -> Tensor:
    """The codes of groups for w ~ a*q - b: q = round((w + b) / a) in [0, 15], 0 where a is 0.
    wb = w + b: [R, G, 32]; a: [R, G] -> q [R, G, 32] fp32."""
    a3 = a[..., None]
    if bool((a > 0).all()):                                  # the usual case: no zero step to guard
        return (wb / a3).round_().clamp_(0, 15)
    safe = torch.where(a3 > 0, a3, torch.ones_like(a3))
    return torch.where(a3 > 0, (wb / safe).round_().clamp_(0, 15), torch.zeros_like(wb))


def _group_err(w: Tensor, wb: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """Squared error of each group's best codes for w ~ a*q - b: the fp32 residual's squares summed in
    fp64. w, wb = w + b (shared by the candidates of one b): [R, G, 32]; a, b: [R, G] -> [R, G] fp64."""
    diff = (a[..., None] * _codes(wb, a)).sub_(b[..., None]).sub_(w).double()     # (a*q - b) - w, in fp32
    return diff.mul_(diff).sum(-1)


def _group_steps(wg: Tensor) -> tuple[Tensor, Tensor]:
    """Per-group min offset b >= 0 and the best continuous step a (the top code may sit at 12..15).

    wg: [R, G, 32] -> a, b: [R, G]. Searching the top code finds the exact grid of Q4_K data, whose
    groups do not always use code 15, and clips outliers of other data.
    """
    gmin, gmax = wg.amin(-1), wg.amax(-1)                    # [R, G]; NaN or inf when a value is
    _check_finite(bool(torch.isfinite(gmin).all() and torch.isfinite(gmax).all()))
    gmin = gmin.clamp(max=0.0)
    span = gmax - gmin                                                               # [R, G]
    bmin = -gmin
    wb = wg + bmin[..., None]
    best_a, best_e = span / 15.0, None
    for top in (15.0, 14.0, 13.0, 12.0):
        a = span / top
        e = _group_err(wg, wb, a, bmin)
        if best_e is None:
            best_e = e
        else:
            better = e < best_e
            best_a, best_e = torch.where(better, a, best_a), torch.where(better, e, best_e)
    return best_a, bmin


@dataclass
class _Scales:
    """The integer sub-scales of one grid (levels 63 or 255) for R rows: sc, m float [R, KB, 8] (integer
    values), d, dm fp32 [R, KB], and the squared error of each super-block, err fp64 [R, KB]."""

    sc: Tensor
    m: Tensor
    d: Tensor
    dm: Tensor
    err: Tensor

    def pick(self, other: _Scales, take: Tensor) -> _Scales:
        """Per super-block (take [R, KB]): other's scales where take, else these (err: left out)."""
        t3 = take[..., None]
        return _Scales(torch.where(t3, other.sc, self.sc), torch.where(t3, other.m, self.m),
                       torch.where(take, other.d, self.d), torch.where(take, other.dm, self.dm), torch.empty(0))

    def steps(self) -> tuple[Tensor, Tensor]:       # a = d*sc, b = dm*m: [R, G] each
        r = self.sc.shape[0]
        return (self.d[:, :, None] * self.sc).view(r, -1), (self.dm[:, :, None] * self.m).view(r, -1)


def _q4_scales(wg: Tensor, best_a: Tensor, bmin: Tensor, levels: int) -> _Scales:
    """Integer sub-scales in [0, levels] for groups wg [R, G, 32] (each group's sc: the rounded one or
    one either side, whichever fits best)."""
    r = wg.shape[0]
    g8 = best_a.view(r, -1, 8)                                                       # [R, KB, 8]
    d = g8.amax(-1) / levels                                                         # [R, KB]
    dm = bmin.view(r, -1, 8).amax(-1) / levels
    dsafe = torch.where(d > 0, d, torch.ones_like(d))[:, :, None]
    dmsafe = torch.where(dm > 0, dm, torch.ones_like(dm))[:, :, None]
    m = torch.round(bmin.view(r, -1, 8) / dmsafe).clamp_(0, levels)
    b_q = (dm[:, :, None] * m).view(r, -1)                                           # [R, G]
    wb = wg + b_q[..., None]
    sc0 = torch.round(g8 / dsafe)
    best_sc, best_e = None, None
    for delta in (0.0, -1.0, 1.0):
        sc = (sc0 + delta).clamp_(0, levels)
        e = _group_err(wg, wb, (d[:, :, None] * sc).view(r, -1), b_q)
        if best_e is None:
            best_sc, best_e = sc, e
        else:
            better = e < best_e
            best_sc = torch.where(better.view(r, -1, 8), sc, best_sc)
            best_e = torch.where(better, e, best_e)
    return _Scales(best_sc, m, d, dm, best_e.view(r, -1, 8).sum(-1))


def _q4_chunk(wg: Tensor) -> Q4Codes:
    """q4 codes of R rows of groups wg [R, G, 32]: each super-block on Q4_K's grid of 6-bit sub-scales
    (exact on weights that came from Q4_K) or on 8-bit ones (better on anything else), whichever fits
    best; the codes are made once, for the steps chosen."""
    r = wg.shape[0]
    best_a, bmin = _group_steps(wg)
    s63, s255 = _q4_scales(wg, best_a, bmin, 63), _q4_scales(wg, best_a, bmin, 255)
    s = s63.pick(s255, s255.err < s63.err)
    a, b = s.steps()
    q = _codes(wg + b[..., None], a)                                                 # [R, G, 32]
    return Q4Codes(q=q.view(r, -1).to(torch.uint8), sc=s.sc.reshape(r, -1).to(torch.uint8),
                   m=s.m.reshape(r, -1).to(torch.uint8), d=s.d.contiguous(), dm=s.dm.contiguous())


def quantize_q4(weight: Tensor) -> Q4Codes:
    """4-bit super-block quantization of w [N, K] (K zero-padded to a multiple of 256).

    Rows are independent, so they go through in small chunks whose temporaries stay in cache."""
    w = _check_shape(weight)                   # finiteness: checked on each chunk's group extremes
    n, k = w.shape
    kp = _round_up(k, SUPER)
    parts: list[Q4Codes] = []
    chunk = max(1, _Q4_CHUNK // kp)                                                  # rows
    for r0 in range(0, n, chunk):
        r1 = min(n, r0 + chunk)
        if k == kp:
            rows = w[r0:r1]
        else:
            rows = torch.zeros(r1 - r0, kp, dtype=torch.float32)
            rows[:, :k] = w[r0:r1]
        parts.append(_q4_chunk(rows.view(r1 - r0, kp // GROUP, GROUP)))              # [R, G, 32]
    return Q4Codes(*(torch.cat([getattr(p, f) for p in parts]) for f in ("q", "sc", "m", "d", "dm")))


def pack_q4(weight: Tensor, error: WeightError | None = None) -> dict[str, Tensor]:
    """{"qs", "sc", "mn", "dd", "meta"} in the kernel layout (see cpu_kernels.cpp); `error` (when given)
    gets the sums of the codes' values against the weight."""
    n, k = weight.shape if weight.dim() == 2 else (0, 0)
    c = quantize_q4(weight)
    if error is not None:
        error.add(c.dequantize()[:, :k], weight.detach().float())
    return pack_q4_codes(c, n, k)


def q4_groups(k: int) -> int:
    """Groups of 32 inputs a packed q4 strip holds for K inputs: K rounded up to a pair of groups (64, the
    unit of the packed minimums and of the activation group sums), not to a whole super-block."""
    return 2 * (-(-k // (2 * GROUP)))


def pack_q4_codes(c: Q4Codes, n: int, k: int) -> dict[str, Tensor]:
    """Codes (K padded to whole super-blocks) in the kernel layout, minus the groups past q4_groups(k)."""
    kp = c.q.shape[1]
    np_, kb = _round_up(n, STRIP), kp // SUPER
    nb, g = np_ // STRIP, q4_groups(k)
    if g > kb * 8:
        raise ValueError(f"q4 codes cover {kp} inputs, fewer than the {k} of the weight")

    def pad_rows(t: Tensor) -> Tensor:
        out = torch.zeros((np_,) + tuple(t.shape[1:]), dtype=t.dtype)
        out[:n] = t
        return out

    q = pad_rows(c.q).view(nb, STRIP, kb, 8, 2, 4, 4)        # [NB, col, KB, g, half, j, i]
    nibbles = q.permute(0, 2, 3, 5, 1, 6, 4)                  # [NB, KB, g, j, col, i, half]
    qs = (nibbles[..., 0] | (nibbles[..., 1] << 4)).reshape(nb, kb * 8, 4, STRIP, 4)   # [NB, KB*8, 4, 16, 4]
    sc = pad_rows(c.sc).view(nb, STRIP, kb * 8).permute(0, 2, 1)                         # [NB, KB*8, 16]
    mn = pad_rows(c.m).view(nb, STRIP, kb * 4, 2).permute(0, 2, 1, 3)                   # [NB, KB*4, 16, 2]
    dd = torch.stack([pad_rows(c.d), pad_rows(c.dm)], dim=1)                             # [NP, 2, KB]
    dd = dd.view(nb, STRIP, 2, kb).permute(0, 3, 2, 1).contiguous()                     # [NB, KB, 2, 16]
    return {"qs": qs[:, :g].contiguous(), "sc": sc[:, :g].contiguous(), "mn": mn[:, : g // 2].contiguous(),
            "dd": dd, "meta": _meta(n, k)}


def compact_q4(packed: dict[str, Tensor]) -> dict[str, Tensor]:
    """The kernel layout of a q4 packing: qs [NB, G, 4, 16, 4], sc [NB, G, 16], mn [NB, G/2, 16, 2],
    dd [NB, KB, 2, 16] with G = q4_groups(K), KB = ceil(G / 8). Packings stored before partial super-blocks
    (qs [NB, KB, 8, 4, 16, 4], K padded to 256) are views of it when K is a multiple of 256, and lose
    their all-zero padding groups (a copy) otherwise; the codes that remain are the same bytes."""
    _, k = (int(v) for v in packed["meta"])
    g = q4_groups(k)
    qs, sc, mn, dd = packed["qs"], packed["sc"], packed["mn"], packed["dd"]
    nb = qs.shape[0]
    qs = qs.reshape(nb, -1, 4, STRIP, 4)
    sc = sc.reshape(nb, -1, STRIP)
    mn = mn.reshape(nb, -1, STRIP, 2)
    kb = -(-g // 8)
    if qs.shape[1] < g or sc.shape[1] < g or mn.shape[1] < g // 2 or tuple(dd.shape) != (nb, kb, 2, STRIP):
        raise ValueError(f"packed q4 weight of K={k} needs {g} groups and dd [{nb}, {kb}, 2, {STRIP}]; got qs "
                         f"{tuple(packed['qs'].shape)}, sc {tuple(packed['sc'].shape)}, dd {tuple(dd.shape)}")
    return {**packed, "qs": qs[:, :g], "sc": sc[:, :g], "mn": mn[:, : g // 2]}


def unpack_q4(packed: dict[str, Tensor]) -> Q4Codes:
    """Inverse layout of pack_q4 (codes for the real N rows, KP columns: K padded to whole super-blocks,
    the groups past q4_groups(K) zero)."""
    n, _ = (int(v) for v in packed["meta"])
    p = compact_q4(packed)
    nb, kb = p["qs"].shape[0], p["dd"].shape[1]

    def pad(t: Tensor, groups: int) -> Tensor:               # zero groups up to whole super-blocks
        out = torch.zeros((nb, groups) + tuple(t.shape[2:]), dtype=t.dtype)
        out[:, : t.shape[1]] = t
        return out

    qs = pad(p["qs"], kb * 8).view(nb, kb, 8, 4, STRIP, 4)   # [NB, KB, 8, 4, 16, 4]
    halves = torch.stack([qs & 15, qs >> 4], dim=-1)           # [NB, KB, g, j, col, i, half]
    q = halves.permute(0, 4, 1, 2, 6, 3, 5).reshape(nb * STRIP, kb * SUPER)
    sc = pad(p["sc"], kb * 8).permute(0, 2, 1).reshape(nb * STRIP, kb * 8)
    m = pad(p["mn"], kb * 4).permute(0, 2, 1, 3).reshape(nb * STRIP, kb * 8)
    dd = p["dd"].permute(0, 3, 2, 1).reshape(nb * STRIP, 2, kb)
    return Q4Codes(q=q[:n].contiguous(), sc=sc[:n].contiguous(), m=m[:n].contiguous(),
                   d=dd[:n, 0].contiguous(), dm=dd[:n, 1].contiguous())


def join_rows(parts: list[Tensor]) -> Tensor:
    """torch.cat(parts) along dim 0, as a view when the parts already lie end to end in one storage (a
    bundle's packing, memory-mapped whole, stores a joined run's parts so: zoo/pull.py, models/mapped.py),
    else a copy. The values are the same either way; the view shares the parts' memory, which packed
    weights never write."""
    first = parts[0]
    if len(parts) > 1 and _end_to_end(parts):
        rows = sum(p.shape[0] for p in parts)
        shape = (rows, *first.shape[1:])
        return first.as_strided(shape, torch.empty(shape, device="meta").stride(), first.storage_offset())
    return torch.cat(parts)


def _end_to_end(parts: list[Tensor]) -> bool:
    """Whether contiguous `parts` of one dtype and row shape follow each other in one storage, in order."""
    first = parts[0]
    storage = first.untyped_storage().data_ptr()
    if any(p.dtype != first.dtype or p.shape[1:] != first.shape[1:] or not p.is_contiguous()
           or p.untyped_storage().data_ptr() != storage for p in parts):
        return False
    return all(b.data_ptr() == a.data_ptr() + a.numel() * a.element_size() for a, b in zip(parts, parts[1:]))


def concat_rows(parts: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """One packing of the rows of several, in order: every part but the last must hold whole 16-row strips
    (its N a multiple of STRIP) and all the same K. Packing rows in blocks and joining them gives the bytes
    of packing them at once, since every layout here is strips along its first dimension."""
    ns, ks = zip(*((int(v) for v in p["meta"]) for p in parts))
    if any(n % STRIP for n in ns[:-1]) or len(set(ks)) != 1:
        raise ValueError(f"packings of N = {list(ns)}, K = {list(ks)} do not join: all but the last need "
                         f"whole {STRIP}-row strips, and all one K")
    out = {key: torch.cat([p[key] for p in parts]) for key in parts[0] if key != "meta"}
    out["meta"] = _meta(sum(ns), ks[0])
    return out


def check_packed(packed: dict[str, Tensor], parts: tuple[str, ...], fmt: str) -> tuple[int, int]:
    """Validate that `packed` has the parts of `fmt` and return (N, K)."""
    missing = [p for p in parts if p not in packed]
    if missing:
        raise ValueError(f"packed {fmt} weight lacks {missing}; it has {sorted(packed)} (was it packed by another backend?)")
    n, k = (int(v) for v in packed["meta"])
    return n, k
