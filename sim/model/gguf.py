"""GGUF input: a model spec from a GGUF file's header, without reading its weights.

The one module of :mod:`sim` that reads GGUF. :func:`read_gguf_index` parses the header, the
key/value metadata and the tensor table (the format of llama.cpp's ``ggml/src/gguf.cpp`` and
gguf-py's ``GGUFReader``), skipping array values (a 262k-token vocabulary is stepped over, not
decoded); :func:`load_gguf_model` turns that into a :class:`sim.model.specs.ModelSpec` whose tensors
are the file's, with their real ggml types and bytes.

GGUF layout (little-endian; v2 and v3 have 64-bit counts and lengths)::

    "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x (string key | u32 value type | value)        string = u64 length + UTF-8 bytes
    n_tensors x (string name | u32 n_dims | n_dims x u64 ne | u32 ggml type | u64 offset)
    padding to general.alignment (default 32) | tensor data (offsets relative to here)

Errors are one-line :class:`sim.errors.ScenarioError` naming the file and what is wrong (not a
GGUF file, unsupported version, truncated, an unknown value or tensor type, a tensor whose data
lies past the end of the file, a missing architecture key), never a traceback.
"""

from __future__ import annotations

import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Sequence

from sim.errors import ScenarioError
from sim.model.quant import GGML_BLOCK, GGML_TYPE_BPW
from sim.wording import plural

if TYPE_CHECKING:
    from sim.model.specs import ModelSpec

__all__ = [
    "GGUF_MAGIC", "GGUF_VALUE_TYPES", "GGML_TYPE_ID", "GGML_TYPE_NAME", "LLAMA_FTYPE_NAME",
    "GGUFArray", "GGUFTensor", "GGUFIndex", "read_gguf_index", "is_gguf", "load_gguf_model",
    "tensor_group", "size_class", "ftype_name", "model_label",
]

#: the first four bytes of every GGUF file
GGUF_MAGIC = b"GGUF"

#: GGUF metadata value types (``enum gguf_type``, ``ggml/include/gguf.h``; gguf-py
#: ``GGUFValueType``): id -> (name, struct format of one element; ``None`` for string/array)
GGUF_VALUE_TYPES: Mapping[int, tuple[str, str | None]] = {
    0: ("uint8", "<B"), 1: ("int8", "<b"), 2: ("uint16", "<H"), 3: ("int16", "<h"),
    4: ("uint32", "<I"), 5: ("int32", "<i"), 6: ("float32", "<f"), 7: ("bool", "<?"),
    8: ("string", None), 9: ("array", None), 10: ("uint64", "<Q"), 11: ("int64", "<q"),
    12: ("float64", "<d"),
}

#: ``enum ggml_type`` ids (``ggml/include/ggml.h``) of the types :data:`sim.model.quant.GGML_BLOCK` knows
GGML_TYPE_ID: Mapping[str, int] = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q8_1": 9,
    "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q8_K": 15, "IQ2_XXS": 16,
    "IQ2_XS": 17, "IQ3_XXS": 18, "IQ1_S": 19, "IQ4_NL": 20, "IQ3_S": 21, "IQ2_S": 22,
    "IQ4_XS": 23, "I8": 24, "I16": 25, "I32": 26, "I64": 27, "F64": 28, "IQ1_M": 29,
    "BF16": 30, "TQ1_0": 34, "TQ2_0": 35, "MXFP4": 39, "NVFP4": 40, "Q1_0": 41,
}
#: ggml type id -> name
GGML_TYPE_NAME: Mapping[int, str] = {v: k for k, v in GGML_TYPE_ID.items()}

#: ``general.file_type`` (``enum llama_ftype``, ``include/llama.h``) -> the name
#: ``llama_ftype_name`` (``src/llama-model-loader.cpp``) gives it
LLAMA_FTYPE_NAME: Mapping[int, str] = {
    0: "all F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
    10: "Q2_K - Medium", 11: "Q3_K - Small", 12: "Q3_K - Medium", 13: "Q3_K - Large",
    14: "Q4_K - Small", 15: "Q4_K - Medium", 16: "Q5_K - Small", 17: "Q5_K - Medium", 18: "Q6_K",
    19: "IQ2_XXS - 2.0625 bpw", 20: "IQ2_XS - 2.3125 bpw", 21: "Q2_K - Small",
    22: "IQ3_XS - 3.3 bpw", 23: "IQ3_XXS - 3.0625 bpw", 24: "IQ1_S - 1.5625 bpw",
    25: "IQ4_NL - 4.5 bpw", 26: "IQ3_S - 3.4375 bpw", 27: "IQ3_S mix - 3.66 bpw",
    28: "IQ2_S - 2.5 bpw", 29: "IQ2_M - 2.7 bpw", 30: "IQ4_XS - 4.25 bpw", 31: "IQ1_M - 1.75 bpw",
    32: "BF16", 36: "TQ1_0 - 1.69 bpw ternary", 37: "TQ2_0 - 2.06 bpw ternary",
    38: "MXFP4 MoE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}

#: ``LLAMA_FTYPE_GUESSED``: the flag of a file type guessed from the tensors
_FTYPE_GUESSED = 1024

#: the file type ``llama_model_loader`` guesses from the most common tensor type when
#: ``general.file_type`` is missing (its ``switch (type_max)``)
_GUESSED_FTYPE: Mapping[str, int] = {
    "F32": 0, "F16": 1, "BF16": 32, "Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9, "Q8_0": 7,
    "Q2_K": 10, "Q3_K": 12, "Q4_K": 15, "Q5_K": 17, "Q6_K": 18, "TQ1_0": 36, "TQ2_0": 37,
    "IQ2_XXS": 19, "IQ2_XS": 20, "IQ2_S": 28, "IQ3_XXS": 23, "IQ1_S": 24, "IQ1_M": 31,
    "IQ4_NL": 25, "IQ4_XS": 30, "IQ3_S": 26, "NVFP4": 39, "Q1_0": 40,
}

_MAX_DIMS = 4             # GGML_MAX_DIMS
_WINDOW = 1 << 20         # bytes read from the file at a time while parsing the header


# --------------------------------------------------------------------------------------
# The header reader
# --------------------------------------------------------------------------------------


class GGUFArray(NamedTuple):
    """An array value, left unread.

    Attributes:
        value_type: element type name (:data:`GGUF_VALUE_TYPES`: ``"string"``, ``"int32"`` ...).
        n: number of elements.
        offset: absolute file offset of the first element.
    """

    value_type: str
    n: int
    offset: int


class GGUFTensor(NamedTuple):
    """One entry of the tensor table (unpacks as ``ne, ggml_type, offset, nbytes``).

    Attributes:
        ne: ggml dimensions, innermost first (``(n_embd, n_ff_exp, n_expert)``).
        ggml_type: ggml type name (``"Q4_K"``).
        offset: absolute file offset of the data.
        nbytes: bytes of the data (``ggml_nbytes``: rows of ``ne[0] / block`` blocks).
    """

    ne: tuple[int, ...]
    ggml_type: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class GGUFIndex:
    """A GGUF's header: metadata and tensor table, no tensor data.

    Attributes:
        path: the file.
        version: GGUF version (2 or 3).
        kv: metadata in file order; scalars and strings as Python values, arrays as their
            element count (their values are in :attr:`arrays`, unread).
        arrays: key -> :class:`GGUFArray` of every array value.
        tensors: name -> :class:`GGUFTensor`, in file order.
        alignment: ``general.alignment`` (default 32).
        data_offset: absolute offset of the tensor data section.
        file_size: bytes of the file.
    """

    path: Path
    version: int
    kv: dict[str, Any]
    arrays: dict[str, GGUFArray]
    tensors: dict[str, GGUFTensor]
    alignment: int
    data_offset: int
    file_size: int

    @property
    def tensor_bytes(self) -> int:
        """Sum of the tensors' data bytes (llama.cpp's ``n_bytes``: llama-bench's ``model_size``)."""
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def n_elements(self) -> int:
        """Sum of the tensors' elements (llama-bench's ``model_n_params``)."""
        return sum(math.prod(t.ne) for t in self.tensors.values())

    def read_array(self, key: str, max_len: int = 1 << 16) -> list[Any]:
        """The values of an array of the metadata (numbers, bools or strings).

        Raises:
            KeyError: no array under ``key``.
            ScenarioError: more than ``max_len`` elements, nested arrays, or a truncated file.
        """
        a = self.arrays[key]
        if a.n > max_len:
            raise ScenarioError(f"metadata array '{key}' has {a.n} elements (reading at most {max_len})",
                                file=self.path)
        with open(self.path, "rb") as fh:
            cur = _Cursor(fh, self.file_size, self.path, a.offset)
            if a.value_type == "string":
                return [cur.string(key) for _ in range(a.n)]
            if a.value_type == "array":
                raise ScenarioError(f"metadata array '{key}': nested arrays are not supported", file=self.path)
            fmt = next(f for name, f in GGUF_VALUE_TYPES.values() if name == a.value_type)
            assert fmt is not None
            size = struct.calcsize(fmt)
            raw = cur.take(a.n * size, key)
            return [v[0] for v in struct.iter_unpack(fmt, raw)]

    def array(self, name: str) -> Any:
        """A tensor's raw data, memory-mapped: ``(rows, bytes per row)`` uint8 numpy array (F32
        tensors as float32 ``(rows, ne[0])``).

        Raises:
            KeyError: no such tensor.
        """
        import numpy as np

        ne, t, off, nb = self.tensors[name]
        blk, size = GGML_BLOCK[t]
        row = ne[0] // blk * size
        rows = nb // row if row else 0
        mm = np.memmap(self.path, np.uint8, "r", offset=off, shape=(nb,))
        a = mm.reshape(rows, row)
        return a.view(np.float32) if t == "F32" else a


class _Cursor:
    """Sequential reads from a file through a window of :data:`_WINDOW` bytes; every read
    past the end raises a ScenarioError that says the file is truncated."""

    def __init__(self, fh: Any, size: int, path: Path, pos: int = 0):
        self.fh, self.size, self.path = fh, size, path
        self.pos = pos
        self.base = pos
        self.buf = b""

    def _fill(self, n: int, what: str) -> int:
        """Make ``[pos, pos + n)`` available; return its start in ``buf``."""
        if self.pos + n > self.size:
            raise ScenarioError(f"truncated: {what} needs bytes {self.pos}..{self.pos + n} of a "
                                f"{self.size}-byte file", file=self.path)
        off = self.pos - self.base
        if off < 0 or off + n > len(self.buf):
            self.fh.seek(self.pos)
            self.buf = self.fh.read(max(n, _WINDOW))
            self.base = self.pos
            off = 0
            if len(self.buf) < n:
                raise ScenarioError(f"truncated: {what} ends past the end of the file", file=self.path)
        return off

    def take(self, n: int, what: str) -> bytes:
        off = self._fill(n, what)
        self.pos += n
        return self.buf[off:off + n]

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        off = self._fill(n, what)
        self.pos += n
        return struct.unpack_from(fmt, self.buf, off)[0]

    def string(self, what: str, max_len: int | None = None) -> str:
        """A GGUF string (u64 length, UTF-8 bytes). ``max_len``: a longer one is a corrupt header
        (refused before it is read, so no error quotes it)."""
        n = self.unpack("<Q", what)
        if max_len is not None and n > max_len:
            raise ScenarioError(f"corrupt header: {what} is {n} bytes long (a name; at most {max_len} "
                                "accepted)", file=self.path)
        if n > self.size - self.pos:
            raise ScenarioError(f"corrupt or truncated: {what} is a string of {n} bytes at byte "
                                f"{self.pos - 8} of a {self.size}-byte file", file=self.path)
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", "replace")

    def skip_strings(self, n: int, what: str) -> None:
        """Step over ``n`` strings (reads their lengths only)."""
        unpack_from, size = struct.unpack_from, self.size
        pos, base, buf = self.pos, self.base, self.buf
        end = base + len(buf)
        for _ in range(n):
            if pos + 8 > end:
                self.pos = pos
                self._fill(8, what)
                base, buf = self.base, self.buf
                end = base + len(buf)
            pos += 8 + unpack_from("<Q", buf, pos - base)[0]
            if pos > size:
                raise ScenarioError(f"truncated: {what} ends past the end of the {size}-byte file",
                                    file=self.path)
        self.pos = pos

    def skip(self, n: int, what: str) -> None:
        if self.pos + n > self.size:
            raise ScenarioError(f"truncated: {what} ends past the end of the {self.size}-byte file",
                                file=self.path)
        self.pos += n


#: longest metadata key or tensor name accepted (bytes): ggml caps tensor names at
#: ``GGML_MAX_NAME`` (64); keys are dotted names of a few tens of bytes. A longer one is a corrupt
#: length field, and quoting it would dump the file into the error message.
NAME_MAX = 1024

#: ``GGML_MAX_NAME`` (ggml.h): a tensor name of this many bytes or more is refused by
#: ``gguf_init_from_file_impl`` ("tensor name ... is too long")
GGML_MAX_NAME = 64


def _open(path: Path) -> Any:
    try:
        if path.is_dir():
            raise ScenarioError("is a folder, expected a GGUF file", file=path)
        if path.exists() and not path.is_file():  # a FIFO or a device would block or never end
            raise ScenarioError("is not a regular file (a FIFO, socket or device), expected a GGUF file", file=path)
        return open(path, "rb")
    except FileNotFoundError:
        raise ScenarioError("file not found", file=path) from None
    except OSError as exc:
        raise ScenarioError(f"cannot read: {exc.strerror or exc}", file=path) from None


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` is a readable file that starts with the GGUF magic (no error raised)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == GGUF_MAGIC
    except OSError:
        return False


def read_gguf_index(path: str | Path) -> GGUFIndex:
    """Parse a GGUF's header, metadata and tensor table (not the tensor data).

    Array values are skipped: string arrays by their lengths, numeric arrays by one seek, so a
    262k-token vocabulary costs a few tens of milliseconds and a 100 GB file loads in well under a
    second. The checks follow ``gguf_init_from_file_impl`` (``ggml/src/gguf.cpp``): magic,
    version 2 or 3, known value types, no duplicate keys or tensor names, at most 4 dimensions,
    known ggml types whose block divides ``ne[0]``, aligned tensor offsets; and every tensor's
    data must lie inside the file (a truncated download fails here, not later).

    Raises:
        ScenarioError: naming the file and the problem (missing, a folder, not GGUF, an
            unsupported version, truncated or corrupt header, unknown types, data past the end).
    """
    path = Path(path)
    with _open(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        cur = _Cursor(fh, size, path)
        if size < 4:
            raise ScenarioError(f"not a GGUF file ({size} bytes, no GGUF magic)", file=path)
        magic = cur.take(4, "the magic")
        if magic != GGUF_MAGIC:
            raise ScenarioError(f"not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})", file=path)
        ver = cur.unpack("<I", "the version")
        if ver not in (2, 3):
            if int.from_bytes(ver.to_bytes(4, "little"), "big") in (2, 3):
                raise ScenarioError("a big-endian GGUF is not supported (little-endian v2 and v3 are)", file=path)
            raise ScenarioError(f"GGUF version {ver} is not supported (2 and 3 are)", file=path)
        n_t = cur.unpack("<Q", "the tensor count")
        n_kv = cur.unpack("<Q", "the metadata count")
        # every key and every tensor entry takes at least 8 + 4 bytes: a larger count is corrupt
        if n_kv > size // 12 or n_t > size // 12:
            raise ScenarioError(f"corrupt header: {plural(n_kv, 'metadata entry', 'metadata entries')} and "
                                f"{plural(n_t, 'tensor')} cannot fit in "
                                f"{size} bytes", file=path)
        kv: dict[str, Any] = {}
        arrays: dict[str, GGUFArray] = {}
        for i in range(n_kv):
            key = cur.string(f"metadata key {i}", NAME_MAX)
            if key in kv:
                raise ScenarioError(f"duplicate metadata key '{key}'", file=path)
            vt = cur.unpack("<I", f"the type of '{key}'")
            if vt not in GGUF_VALUE_TYPES:
                raise ScenarioError(f"metadata '{key}': unknown value type {vt}", file=path)
            name, fmt = GGUF_VALUE_TYPES[vt]
            if name == "string":
                kv[key] = cur.string(f"metadata '{key}'")
            elif name == "array":
                et = cur.unpack("<I", f"the element type of '{key}'")
                n = cur.unpack("<Q", f"the length of '{key}'")
                if et not in GGUF_VALUE_TYPES:
                    raise ScenarioError(f"metadata '{key}': unknown array element type {et}", file=path)
                ename, efmt = GGUF_VALUE_TYPES[et]
                arrays[key] = GGUFArray(ename, n, cur.pos)
                if ename == "string":
                    if n > (size - cur.pos) // 8:
                        raise ScenarioError(f"corrupt or truncated: metadata '{key}' claims {n} strings",
                                            file=path)
                    cur.skip_strings(n, f"metadata '{key}'")
                elif ename == "array":
                    raise ScenarioError(f"metadata '{key}': nested arrays are not supported", file=path)
                else:
                    assert efmt is not None
                    cur.skip(n * struct.calcsize(efmt), f"metadata '{key}'")
                kv[key] = n
            else:
                assert fmt is not None
                kv[key] = cur.unpack(fmt, f"metadata '{key}'")
        align = kv.get("general.alignment", 32)
        if isinstance(align, bool) or not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise ScenarioError(f"general.alignment must be a power of two, got {align!r}", file=path)
        infos: list[tuple[str, tuple[int, ...], str, int]] = []
        seen: set[str] = set()
        for i in range(n_t):
            name = cur.string(f"tensor name {i}", NAME_MAX)
            if len(name.encode()) >= GGML_MAX_NAME:
                raise ScenarioError(f"tensor name {i} is too long: {len(name.encode())} bytes >= {GGML_MAX_NAME} "
                                    "(ggml's GGML_MAX_NAME; llama.cpp refuses the file)", file=path)
            if name in seen:
                raise ScenarioError(f"duplicate tensor name '{name}'", file=path)
            seen.add(name)
            nd = cur.unpack("<I", f"tensor '{name}'")
            if not 1 <= nd <= _MAX_DIMS:
                raise ScenarioError(f"tensor '{name}' has {nd} dimensions (1..{_MAX_DIMS} allowed)", file=path)
            ne = struct.unpack(f"<{nd}Q", cur.take(8 * nd, f"tensor '{name}'"))
            tid = cur.unpack("<I", f"tensor '{name}'")
            off = cur.unpack("<Q", f"tensor '{name}'")
            if tid not in GGML_TYPE_NAME:
                raise ScenarioError(f"tensor '{name}' has unknown ggml type id {tid}", file=path)
            t = GGML_TYPE_NAME[tid]
            if any(d < 0 or d >= 1 << 62 for d in ne) or ne[0] % GGML_BLOCK[t][0]:
                raise ScenarioError(f"tensor '{name}': shape {list(ne)} is not valid for type {t} (blocks of "
                                    f"{GGML_BLOCK[t][0]} along ne[0])", file=path)
            if off % align:
                raise ScenarioError(f"tensor '{name}': data offset {off} is not a multiple of the alignment "
                                    f"{align}", file=path)
            infos.append((name, tuple(int(d) for d in ne), t, off))
        base = cur.pos + (-cur.pos % align)
    tensors: dict[str, GGUFTensor] = {}
    expect = 0  # gguf_init_from_file_impl: each tensor's data follows the previous one's, padded
    for name, ne, t, off in infos:
        blk, bsize = GGML_BLOCK[t]
        nb = math.prod(ne) // blk * bsize
        if off != expect:
            raise ScenarioError(f"tensor '{name}' has data offset {off}, expected {expect} (llama.cpp's GGUF "
                                "reader takes the tensors' data in table order, each padded to the alignment)",
                                file=path)
        expect += nb + (-nb % align)
        if base + off + nb > size:
            raise ScenarioError(f"truncated: tensor '{name}' ({nb} bytes at {base + off}) ends past the end "
                                f"of the {size}-byte file", file=path)
        tensors[name] = GGUFTensor(ne, t, base + off, nb)
    return GGUFIndex(path, ver, kv, arrays, tensors, align, base, size)


# --------------------------------------------------------------------------------------
# Tensor roles
# --------------------------------------------------------------------------------------

_BLK = re.compile(r"blk\.(\d+)\.(.+)\Z", re.S)

#: ``<role>.weight`` inside a block -> ModelSpec tensor group
_BLOCK_GROUPS: Mapping[str, str] = {
    "attn_q": "attn_q", "attn_k": "attn_k", "attn_v": "attn_v", "attn_output": "attn_output",
    "ffn_gate": "ffn_gate", "ffn_up": "ffn_up", "ffn_down": "ffn_down",
    "ffn_gate_inp": "router", "ffn_gate_exps": "exps_gate", "ffn_gate_up_exps": "exps_gate",
    "ffn_up_exps": "exps_up", "ffn_down_exps": "exps_down", "ffn_gate_shexp": "shexp",
    "ffn_up_shexp": "shexp", "ffn_down_shexp": "shexp", "attn_sinks": "bias",
}


def tensor_group(name: str) -> tuple[int, str]:
    """``(layer, group)`` of a GGUF tensor name: the block index (-1 outside the blocks) and
    the :class:`sim.model.specs.Tensor` group (:data:`sim.model.quant.TENSOR_GROUPS`, or ``"other"`` for a
    role the simulator does not model, e.g. a fused ``attn_qkv``).

    ``token_embd.weight`` -> embd, ``output.weight`` -> output, ``*_norm.weight`` -> norm,
    ``*.bias`` and ``attn_sinks.weight`` -> bias, ``blk.N.ffn_up_exps.weight`` -> exps_up ...
    """
    m = _BLK.match(name)
    layer, rest = (int(m.group(1)), m.group(2)) if m else (-1, name)
    if rest.endswith(".bias"):
        return layer, "bias"
    if not rest.endswith(".weight"):
        return layer, "other"
    role = rest[:-len(".weight")]
    if layer < 0:
        return layer, {"token_embd": "embd", "output": "output", "output_norm": "norm"}.get(
            role, "norm" if role.endswith("_norm") else "other")
    if role.endswith("_norm"):
        return layer, "norm"
    return layer, _BLOCK_GROUPS.get(role, "other")


# --------------------------------------------------------------------------------------
# llama.cpp's model label: arch, size class, file type
# --------------------------------------------------------------------------------------


def _llama_size(n_layer: int, n_expert: int, n_vocab: int, n_head: int, n_head_kv: int) -> str:
    if n_expert == 8:
        return {32: "8x7B", 56: "8x22B"}.get(n_layer, "?B")
    if n_layer == 32:
        return "3B" if n_vocab == 49152 else ("7B" if n_vocab < 40000 else "8B")
    if n_layer == 80:
        return "65B" if n_head == n_head_kv else "70B"
    return {16: "1B", 22: "1B", 26: "3B", 28: "3B", 30: "256M", 36: "8B", 40: "13B", 48: "34B",
            60: "30B"}.get(n_layer, "?B")


#: ``load_arch_hparams`` of each arch (``src/models/<arch>.cpp``): block count -> size class
_SIZE_BY_LAYERS: Mapping[str, Mapping[int, str]] = {
    "qwen3moe": {48: "30B.A3B", 94: "235B.A22B"},
    "gemma3": {18: "270M", 26: "1B", 32: "8B", 34: "4B", 48: "12B", 62: "27B"},
    "gpt-oss": {24: "20B", 36: "120B"},
    "laguna": {40: "30B.A3B", 48: "118B.A8B", 70: "230B.A10B"},
}


#: the ``general.architecture`` values :func:`load_gguf_model` takes: the llama-shaped archs the
#: simulator models (attention q/k/v/o and a gated dense or MoE FFN per block; the per-arch
#: tensor layouts of ``sim.model.specs._layout``, the SWA defaults and the size classes above).
#: Another arch (mamba, a fused-qkv arch, ...) would be simulated as something it is not.
MODELLED_ARCHS: tuple[str, ...] = ("gemma3", "gpt-oss", "laguna", "llama", "qwen3moe")


def size_class(arch: str, n_layer: int, *, n_expert: int = 0, n_vocab: int = 0, n_head: int = 0,
               n_head_kv: int = 0) -> str:
    """llama.cpp's size class of a model (``llm_type_name(model.type)``): what
    ``load_arch_hparams`` in ``src/models/<arch>.cpp`` picks from the hyper-parameters, for the
    archs of the shipped models (``qwen3moe``, ``gemma3``, ``gpt-oss``, ``llama`` with or
    without 8 experts) and ``laguna``; ``"?B"`` (``LLM_TYPE_UNKNOWN``, what llama.cpp prints)
    for other block counts and archs."""
    if arch == "llama":
        return _llama_size(n_layer, n_expert, n_vocab, n_head, n_head_kv)
    return _SIZE_BY_LAYERS.get(arch, {}).get(n_layer, "?B")


def ftype_name(file_type: int | None, tensor_types: Sequence[tuple[str, str]] = ()) -> str:
    """llama.cpp's file-type name (``llama_ftype_name``): of ``general.file_type`` when the file
    has it, else guessed as ``llama_model_loader`` does (the most common tensor type, counted in
    its tensor order: by block index, then by name; the first type to reach the top count wins)
    with the ``"(guessed) "`` prefix.

    Args:
        file_type: ``general.file_type`` (None = absent).
        tensor_types: ``(name, ggml type)`` of every tensor (for the guess).
    """
    if file_type is not None:
        guessed = bool(file_type & _FTYPE_GUESSED)
        name = LLAMA_FTYPE_NAME.get(file_type & ~_FTYPE_GUESSED, "unknown, may not work")
        return f"(guessed) {name}" if guessed else name

    def order(item: tuple[str, str]) -> tuple[int, str]:
        m = _BLK.match(item[0])
        return (int(m.group(1)) if m else -1, item[0])
    counts: dict[str, int] = {}
    top, top_n = "F32", 0
    for _name, t in sorted(tensor_types, key=order):
        counts[t] = counts.get(t, 0) + 1
        if counts[t] > top_n:
            top, top_n = t, counts[t]
    return "(guessed) " + LLAMA_FTYPE_NAME[_GUESSED_FTYPE.get(top, 0)]


def model_label(arch: str, size: str, ftype: str) -> str:
    """llama-bench's ``model_type`` (``llama_model::desc()``): ``"<arch> <size class> <file type>"``,
    e.g. ``"qwen3moe 30B.A3B Q4_K - Medium"``."""
    return f"{arch} {size} {ftype}"


# --------------------------------------------------------------------------------------
# ModelSpec from the header
# --------------------------------------------------------------------------------------

#: sliding-window pattern of the archs that have one when the file gives no
#: ``<arch>.attention.sliding_window_pattern`` (``load_swa_pattern(ml, N)`` in
#: ``src/models/gemma3.cpp`` and ``openai-moe.cpp``): every N-th layer is full
_SWA_DEFAULT_PATTERN: Mapping[str, int] = {"gemma3": 6, "gpt-oss": 2}


class _Meta:
    """Typed access to a header's metadata, with errors naming the file and key."""

    def __init__(self, idx: GGUFIndex, arch: str):
        self.idx, self.arch = idx, arch

    def key(self, k: str) -> str:
        return f"{self.arch}.{k}"

    def error(self, k: str, msg: str) -> ScenarioError:
        return ScenarioError(msg, file=self.idx.path, field=self.key(k))

    def uint(self, k: str, default: int | None = None, *, min_value: int = 0, max_value: int | None = None) -> int:
        full = self.key(k)
        if full in self.idx.arrays:
            raise self.error(k, "per-layer values (an array) are not supported; expected one number")
        v = self.idx.kv.get(full)
        if v is None:
            if default is None:
                raise self.error(k, "missing: the simulator needs it")
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.error(k, f"expected an integer, got {v!r}")
        if v < min_value:
            raise self.error(k, f"must be >= {min_value}, got {v}")
        if max_value is not None and v > max_value:   # the model TOML's bounds (sim.bounds)
            raise self.error(k, f"must be <= {max_value}, got {v}")
        return int(v)

    def has(self, k: str) -> bool:
        return self.key(k) in self.idx.kv


def _swa(meta: _Meta, n_layer: int) -> tuple[int, int]:
    """``(sliding_window, swa_interval)`` of the ModelSpec (0, 0 without SWA)."""
    from sim.bounds import DIM_MAX

    window = meta.uint("attention.sliding_window", 0, max_value=DIM_MAX)
    if not window:
        return 0, 0
    key = meta.key("attention.sliding_window_pattern")
    if key in meta.idx.arrays:
        # per-layer is_swa flags: representable when every N-th layer (N-1, 2N-1, ...) is full
        flags = [bool(x) for x in meta.idx.read_array(key, max_len=max(n_layer, 1) * 4)]
        for n in range(1, len(flags) + 1):
            if flags == [(i + 1) % n != 0 for i in range(len(flags))]:
                return window, n
        raise meta.error("attention.sliding_window_pattern",
                         "a per-layer pattern that is not 'every N-th layer full' is not supported")
    if key in meta.idx.kv:
        n = meta.uint("attention.sliding_window_pattern")
        return (window, n) if n else (window, 0)
    n = _SWA_DEFAULT_PATTERN.get(meta.arch, 0)
    return (window, n) if n else (0, 0)


def _need(idx: GGUFIndex, name: str, why: str) -> GGUFTensor:
    t = idx.tensors.get(name)
    if t is None:
        raise ScenarioError(f"no tensor '{name}' ({why}); this tensor layout is not supported by the simulator",
                            file=idx.path)
    return t


#: a shard's file name as llama.cpp's ``llama_split_path`` makes it: ``PREFIX-%05d-of-%05d.gguf``,
#: the shard's number from 1
_SPLIT_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def merge_split(idx: GGUFIndex) -> GGUFIndex:
    """The header of a split GGUF (``split.count`` > 1, as ``llama-gguf-split`` writes it) as one
    index: the metadata of its first shard (``split.no`` 0, which holds them all) and the tensors of
    every shard in shard order. The shards are found by llama.cpp's naming (``llama_split_path``:
    ``PREFIX-00001-of-00003.gguf`` ...) beside ``idx.path``, the first (:func:`load_gguf_model`
    refuses another, as llama.cpp does).

    Raises:
        ScenarioError: naming the file and field: a shard whose name is not of that form, a
            missing shard, a shard whose ``split.no`` / ``split.count`` disagree with its name, a
            tensor in two shards, ``split.tensors.count`` other than the tensors found.
    """
    import dataclasses

    p, n = idx.path, idx.kv.get("split.count")
    m = _SPLIT_NAME.match(p.name)
    if m is None or int(m["count"]) != n:
        raise ScenarioError(f"a shard of a split GGUF (split.count = {n}) named '{p.name}': llama.cpp finds the "
                            f"other shards by their names, PREFIX-00001-of-{n:05d}.gguf and so on; give the shards "
                            "those names, or merge them (llama-gguf-split --merge FIRST_SHARD OUT.gguf)",
                            file=p, field="split.count")
    shards = [p.with_name(f"{m['prefix']}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]
    missing = [sh for sh in shards if not sh.is_file()]
    if missing:
        raise ScenarioError(f"shard {missing[0].name} of this split GGUF (split.count = {n}) is missing: llama.cpp "
                            "loads every shard", file=p, field="split.count")
    idxs = [idx if sh.resolve() == p.resolve() else read_gguf_index(sh) for sh in shards]
    for k, (sh, x) in enumerate(zip(shards, idxs)):
        if x.kv.get("split.no") != k or x.kv.get("split.count") != n:
            raise ScenarioError(f"split.no {x.kv.get('split.no')!r}, split.count {x.kv.get('split.count')!r}: its "
                                f"name makes it shard {k} of {n}", file=sh, field="split.no")
    tensors: dict[str, GGUFTensor] = {}
    for sh, x in zip(shards, idxs):
        for name, t in x.tensors.items():
            if name in tensors:
                raise ScenarioError(f"tensor '{name}' is in two shards of this split GGUF", file=sh)
            tensors[name] = t
    want = idxs[0].kv.get("split.tensors.count")
    if isinstance(want, int) and not isinstance(want, bool) and want != len(tensors):
        raise ScenarioError(f"split.tensors.count is {want}, but its {n} shards hold {len(tensors)} tensors",
                            file=shards[0], field="split.tensors.count")
    return dataclasses.replace(idxs[0], tensors=tensors, file_size=sum(x.file_size for x in idxs))


def load_gguf_model(path: str | Path) -> ModelSpec:
    """A :class:`sim.model.specs.ModelSpec` from a GGUF's header (no tensor data is read).

    Geometry from the architecture keys (``general.architecture`` = ``<arch>``):
    ``<arch>.block_count``, ``embedding_length``, ``attention.head_count``,
    ``attention.head_count_kv`` (default: head_count), ``attention.key_length`` (default:
    embedding_length / head_count), ``feed_forward_length``, ``expert_count``,
    ``expert_used_count``, ``expert_feed_forward_length`` (default: ``ne[1]`` of the first
    ``ffn_up_exps``), ``expert_shared_count`` (default: 1 when shared-expert tensors exist),
    ``leading_dense_block_count`` (default: the blocks before the first ``ffn_gate_inp``),
    ``context_length`` (the trained context, ``n_ctx_train``; 0 when absent),
    ``attention.sliding_window`` and ``attention.sliding_window_pattern`` (a number, or per-layer
    flags of the form "every N-th layer full"; default 6 for gemma3 and 2 for gpt-oss, as
    llama.cpp); the vocabulary size is ``ne[1]`` of ``token_embd.weight``. For a model whose
    every block is MoE, ``n_ff`` is ``feed_forward_length`` unless that equals the expert size
    (llama and gpt-oss write the expert size there), then 0.

    Tensors: every tensor of the file in file order with its ggml type and exact bytes
    (:class:`sim.model.specs.Tensor`, groups from :func:`tensor_group`); without ``output.weight`` the
    output head is ``token_embd.weight`` duplicated (``duplicate=True``: llama.cpp's
    ``TENSOR_DUPLICATED``, offloaded with the output layer, counted once in size and
    parameters). The name is llama-bench's ``model_type`` (:func:`model_label`).

    Raises:
        ScenarioError: naming the file (and the key) for a file :func:`read_gguf_index` rejects,
            a missing or invalid architecture key, an architecture not in
            :data:`MODELLED_ARCHS`, a geometry the tensors contradict, or a
            tensor layout the plan builder cannot use (fused ``attn_qkv``, no gated FFN, MoE
            layers that are not the last ``n_layer - n_layer_dense_lead`` blocks).
    """
    from sim.model.specs import ModelSpec, MoESpec, Tensor

    idx = read_gguf_index(path)
    p = idx.path
    n_split = idx.kv.get("split.count")
    if isinstance(n_split, int) and not isinstance(n_split, bool) and n_split > 1:
        no = idx.kv.get("split.no")
        if no != 0:   # llama_model_loader: "model must be loaded with the first split"
            m = _SPLIT_NAME.match(p.name)
            first = f"{m['prefix']}-00001-of-{n_split:05d}.gguf" if m else "its first shard"
            raise ScenarioError(f"shard split.no = {no!r} of a split GGUF (split.count = {n_split}): llama.cpp loads "
                                f"a split model from its first shard; give {first}", file=p, field="split.no")
        idx = merge_split(idx)   # llama.cpp loads every shard (llama_get_list_splits)
    arch = idx.kv.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ScenarioError("missing or empty general.architecture (not a llama.cpp model file?)", file=p,
                            field="general.architecture")
    if arch not in MODELLED_ARCHS:
        raise ScenarioError(f"general.architecture '{arch}' is not modelled by the simulator (its graph is built as "
                            f"llama-shaped blocks; supported: {', '.join(MODELLED_ARCHS)})", file=p,
                            field="general.architecture")
    from sim.bounds import COUNT_MAX, DIM_MAX, LLAMA_MAX_EXPERTS, LLAMA_MAX_LAYERS

    meta = _Meta(idx, arch)
    n_layer = meta.uint("block_count", min_value=1)
    if n_layer > LLAMA_MAX_LAYERS:  # llama.cpp asserts it on load (GGML_ASSERT in load_hparams)
        raise meta.error("block_count", f"is {n_layer}; llama.cpp loads at most {LLAMA_MAX_LAYERS} blocks "
                                        "(LLAMA_MAX_LAYERS): llama-bench would abort on this file")
    d_model = meta.uint("embedding_length", min_value=1, max_value=DIM_MAX)
    n_head = meta.uint("attention.head_count", min_value=1, max_value=COUNT_MAX)
    n_head_kv = meta.uint("attention.head_count_kv", n_head, min_value=1, max_value=COUNT_MAX)
    if n_head % n_head_kv:
        raise meta.error("attention.head_count_kv", f"must divide head_count ({n_head}), got {n_head_kv}")
    head_dim = meta.uint("attention.key_length", d_model // n_head, min_value=1, max_value=DIM_MAX)
    emb = _need(idx, "token_embd.weight", "the token embedding")
    if len(emb.ne) != 2 or emb.ne[0] != d_model:
        raise ScenarioError(f"token_embd.weight has shape {list(emb.ne)}, expected [{d_model}, n_vocab] "
                            f"({arch}.embedding_length = {d_model})", file=p)
    n_vocab = emb.ne[1]
    if not 1 <= n_vocab <= DIM_MAX:
        raise ScenarioError(f"token_embd.weight has {n_vocab} rows (the vocabulary): must be 1..{DIM_MAX}", file=p)

    # every tensor, in file order
    tensors: list[Any] = []
    for name, (ne, t, _off, _nb) in idx.tensors.items():
        layer, group = tensor_group(name)
        if layer >= n_layer:
            raise ScenarioError(f"tensor '{name}' is in block {layer}, but {arch}.block_count is {n_layer}", file=p)
        n_out = ne[1] if len(ne) > 1 else 1
        n_mat = math.prod(ne[2:]) if len(ne) > 2 else 1
        tensors.append(Tensor(name, layer, group, ne[0], n_out, n_mat, GGML_TYPE_BPW[t], ggml_type=t))
    blocks = {layer for layer, _g in (tensor_group(t.name) for t in tensors) if layer >= 0}
    if blocks and max(blocks) + 1 < n_layer:   # llama.cpp's loader: "missing tensor 'blk.N...'"
        raise ScenarioError(f"{arch}.block_count is {n_layer}, but the file holds tensors of blocks 0..{max(blocks)} "
                            f"only: the header and the tensors disagree", file=p)
    tied = "output.weight" not in idx.tensors
    if not tied and idx.tensors["output.weight"].ne != (d_model, n_vocab):
        raise ScenarioError(f"output.weight has shape {list(idx.tensors['output.weight'].ne)}, expected "
                            f"[{d_model}, {n_vocab}] (embedding_length, the token embedding's rows)", file=p)
    if tied:
        tensors.append(Tensor("token_embd.weight", -1, "output", d_model, n_vocab, 1, GGML_TYPE_BPW[emb.ggml_type],
                              ggml_type=emb.ggml_type, duplicate=True))

    # attention: what the builder reads, with the geometry the keys give
    nq, nkv = n_head * head_dim, n_head_kv * head_dim
    for i in range(n_layer):
        b = f"blk.{i}."
        for role, n_in, n_out in (("attn_q", d_model, nq), ("attn_k", d_model, nkv), ("attn_v", d_model, nkv),
                                  ("attn_output", nq, d_model)):
            t = _need(idx, b + role + ".weight", f"the attention of block {i}")
            if t.ne[:2] != (n_in, n_out):
                raise ScenarioError(f"{b}{role}.weight has shape {list(t.ne)}, the header's geometry gives "
                                    f"[{n_in}, {n_out}] (embedding_length {d_model}, head_count {n_head}, "
                                    f"head_count_kv {n_head_kv}, key_length {head_dim})", file=p)

    # MoE
    moe_layers = [i for i in range(n_layer) if f"blk.{i}.ffn_gate_inp.weight" in idx.tensors]
    n_expert = meta.uint("expert_count", 0, max_value=COUNT_MAX)
    if n_expert > LLAMA_MAX_EXPERTS:  # llama.cpp asserts it on load (GGML_ASSERT in load_hparams)
        raise meta.error("expert_count", f"is {n_expert}; llama.cpp loads at most {LLAMA_MAX_EXPERTS} experts "
                                         "(LLAMA_MAX_EXPERTS): llama-bench would abort on this file")
    moe = None
    if n_expert or moe_layers:
        if not n_expert:
            raise meta.error("expert_count", ("0" if meta.has("expert_count") else "missing")
                             + ", but the file has expert routers (ffn_gate_inp)")
        if not moe_layers:
            raise ScenarioError(f"{arch}.expert_count is {n_expert}, but no block has an ffn_gate_inp.weight",
                                file=p)
        lead = moe_layers[0]
        if moe_layers != list(range(lead, n_layer)):
            raise ScenarioError(f"MoE blocks {moe_layers[:8]}... are not the last blocks of the model (interleaved "
                                "dense and MoE blocks are not supported)", file=p)
        if meta.has("leading_dense_block_count") and meta.uint("leading_dense_block_count") != lead:
            raise meta.error("leading_dense_block_count", f"is {meta.uint('leading_dense_block_count')}, but the "
                             f"first expert router is in block {lead}")
        n_used = meta.uint("expert_used_count", min_value=1, max_value=COUNT_MAX)
        if n_used > n_expert:
            raise meta.error("expert_used_count", f"top-k {n_used} exceeds expert_count {n_expert}")
        b = f"blk.{lead}."
        fused = b + "ffn_gate_up_exps.weight" in idx.tensors
        up = _need(idx, b + ("ffn_gate_up_exps.weight" if fused else "ffn_up_exps.weight"), "the experts")
        n_ff_exp = meta.uint("expert_feed_forward_length", up.ne[1] // (2 if fused else 1), min_value=1,
                             max_value=DIM_MAX)
        for i in moe_layers:
            b = f"blk.{i}."
            router = idx.tensors[b + "ffn_gate_inp.weight"]
            if router.ne != (d_model, n_expert):
                raise ScenarioError(f"{b}ffn_gate_inp.weight has shape {list(router.ne)}, expected "
                                    f"[{d_model}, {n_expert}] ({arch}.embedding_length {d_model}, expert_count "
                                    f"{n_expert})", file=p)
            names = (["ffn_gate_up_exps"] if fused else ["ffn_gate_exps", "ffn_up_exps"]) + ["ffn_down_exps"]
            for nm in names:
                t = _need(idx, b + nm + ".weight", f"the experts of block {i}")
                want = (n_ff_exp, d_model) if nm == "ffn_down_exps" else (d_model, n_ff_exp * (2 if fused else 1))
                if t.ne != (*want, n_expert):
                    raise ScenarioError(f"{b}{nm}.weight has shape {list(t.ne)}, expected {[*want, n_expert]} "
                                        f"({arch}.expert_count {n_expert}, expert_feed_forward_length "
                                        f"{n_ff_exp})", file=p)
        sh = f"blk.{lead}.ffn_up_shexp.weight"
        n_shared = meta.uint("expert_shared_count", 1 if sh in idx.tensors else 0, max_value=COUNT_MAX)
        n_ff_shexp = 0
        if n_shared:
            n_ff_shexp = _need(idx, sh, "the shared expert").ne[1]
            for i in moe_layers:
                for nm in ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"):
                    _need(idx, f"blk.{i}.{nm}.weight", f"the shared expert of block {i}")
        moe = MoESpec(n_expert=n_expert, n_expert_used=n_used, n_ff_exp=n_ff_exp, n_expert_shared=n_shared,
                      n_ff_shexp=n_ff_shexp, n_layer_dense_lead=lead, fused_gate_up=fused)

    # dense FFN
    dense = [i for i in range(n_layer) if moe is None or i < moe.n_layer_dense_lead]
    n_ff = 0
    if dense:
        up = _need(idx, f"blk.{dense[0]}.ffn_up.weight", f"the FFN of block {dense[0]}")
        n_ff = meta.uint("feed_forward_length", up.ne[1], min_value=1, max_value=DIM_MAX)
        for i in dense:
            for nm in ("ffn_gate", "ffn_up", "ffn_down"):
                t = _need(idx, f"blk.{i}.{nm}.weight", f"the gated FFN of block {i}")
                want = (n_ff, d_model) if nm == "ffn_down" else (d_model, n_ff)
                if t.ne != want:
                    raise ScenarioError(f"blk.{i}.{nm}.weight has shape {list(t.ne)}, expected {list(want)} "
                                        f"({arch}.feed_forward_length {n_ff})", file=p)
    elif meta.has("feed_forward_length") and moe is not None:
        ff = meta.uint("feed_forward_length", max_value=DIM_MAX)
        n_ff = 0 if ff == moe.n_ff_exp else ff

    window, interval = _swa(meta, n_layer)
    file_type = idx.kv.get("general.file_type")
    if file_type is not None and (isinstance(file_type, bool) or not isinstance(file_type, int)):
        raise ScenarioError(f"general.file_type must be an integer, got {file_type!r}", file=p,
                            field="general.file_type")
    label = model_label(arch, size_class(arch, n_layer, n_expert=n_expert, n_vocab=n_vocab, n_head=n_head,
                                         n_head_kv=n_head_kv),
                        ftype_name(file_type, [(n, t.ggml_type) for n, t in idx.tensors.items()]))
    general = idx.kv.get("general.name")
    src = f"GGUF header of {p.name}" + (f" (general.name '{general}')" if isinstance(general, str) and general else "")
    return ModelSpec(
        name=label, n_layer=n_layer, d_model=d_model, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
        n_vocab=n_vocab, n_ff=n_ff, attn_kind="full", sliding_window=window, swa_interval=interval, moe=moe,
        group_types=_group_types(tensors), source=src, file=str(p), arch=arch, tied_embeddings=tied,
        tensor_table=tuple(tensors), n_ctx_train=meta.uint("context_length", 0, max_value=2**31 - 1),
    )


def _group_types(tensors: Sequence[Any]) -> dict[str, str | float]:
    """Per group: the ggml type when all its tensors share one, else the mean bits per weight."""
    by: dict[str, list[Any]] = {}
    for t in tensors:
        if not t.duplicate:
            by.setdefault(t.group, []).append(t)
    out: dict[str, str | float] = {}
    for g, ts in by.items():
        types = {t.ggml_type for t in ts}
        if len(types) == 1:
            out[g] = types.pop()
        else:
            out[g] = sum(t.nbytes * 8 for t in ts) / sum(t.n_params for t in ts)
    return out
