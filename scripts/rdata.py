"""A small pure-Python reader for R's lazy-load data (``data/Rdata.rdx`` + ``Rdata.rdb``).

R packages built with ``LazyData: true`` keep their data sets as serialized R objects:
``Rdata.rdx`` is a gzip-compressed RDS file holding an index (``variables``: name ->
``(offset, length)`` into ``Rdata.rdb``), and each ``Rdata.rdb`` record is a 4-byte
big-endian uncompressed length followed by a zlib stream of one serialized object.
The serialization is R's XDR format (R Internals, section 1.8 "Serialization
Formats"); this reader covers the types that plain data sets use (vectors, lists,
pairlists, symbols, attributes, references), which is enough for ``janeaustenr``.

>>> import struct, zlib
>>> x = b"X\\n" + struct.pack(">iii", 2, 0, 0) + struct.pack(">ii", 16, 1)   # STRSXP, length 1
>>> x += struct.pack(">ii", 0x40009, 2) + b"hi"                          # CHARSXP (UTF-8) "hi"
>>> unserialize(x)
['hi']
>>> read_lazyload_record(struct.pack(">I", len(x)) + zlib.compress(x))
['hi']
"""

from __future__ import annotations

import gzip
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

# SEXP type codes (R Internals, "Serialization Formats")
NILSXP, SYMSXP, LISTSXP, CLOSXP, ENVSXP, PROMSXP, LANGSXP = 0, 1, 2, 3, 4, 5, 6
CHARSXP, LGLSXP, INTSXP, REALSXP, STRSXP, DOTSXP, VECSXP, EXPRSXP = 9, 10, 13, 14, 16, 17, 19, 20
# pseudo-types used only in the stream
REFSXP, NILVALUE_SXP, GLOBALENV_SXP, UNBOUNDVALUE_SXP = 255, 254, 253, 252
MISSINGARG_SXP, BASENAMESPACE_SXP, NAMESPACESXP, EMPTYENV_SXP, BASEENV_SXP = 251, 247, 249, 242, 241
NA_INTEGER = -(2**31)


@dataclass
class RSymbol:
    """An R symbol (a name), e.g. the tag of a pairlist cell."""

    name: str


@dataclass
class RObject:
    """An R value whose Python form needs its attributes kept (names, class, ...)."""

    value: object
    attributes: dict = field(default_factory=dict)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos, self.refs = data, 0, []

    def ints(self, n: int) -> tuple[int, ...]:
        out = struct.unpack_from(f">{n}i", self.data, self.pos)
        self.pos += 4 * n
        return out

    def length(self) -> int:
        (n,) = self.ints(1)
        if n == -1:  # long vector: two more ints
            hi, lo = self.ints(2)
            n = (hi << 32) + lo
        return n

    def pairlist_attrs(self, node: object) -> dict:
        """A pairlist read as {tag: value} (attributes are stored as one)."""
        return dict(node) if isinstance(node, list) else {}

    def item(self) -> object:
        (flags,) = self.ints(1)
        kind = flags & 0xFF
        has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
        if kind in (NILVALUE_SXP, NILSXP):
            return None
        if kind in (GLOBALENV_SXP, UNBOUNDVALUE_SXP, MISSINGARG_SXP, BASENAMESPACE_SXP,
                    EMPTYENV_SXP, BASEENV_SXP):
            return RSymbol(f"<special {kind}>")
        if kind == REFSXP:
            # subtle: the reference index is packed into the flags' upper bits (0 = next int)
            index = flags >> 8 or self.ints(1)[0]
            return self.refs[index - 1]
        if kind == SYMSXP:
            sym = RSymbol(str(self.item()))
            self.refs.append(sym)
            return sym
        if kind == NAMESPACESXP:
            self.ints(1)  # always 0
            value = RSymbol("<namespace " + " ".join(str(x) for x in self.item_vector(STRSXP))
                            + ">")
            self.refs.append(value)
            return value
        if kind == ENVSXP:
            env = RObject({}, {})
            self.refs.append(env)
            self.ints(1)  # locked flag
            self.item()  # enclosing environment (not needed for data)
            frame, hashtab = self.item(), self.item()
            self.item()  # attributes
            env.value = dict(frame) if isinstance(frame, list) else {}
            if isinstance(hashtab, list):
                for bucket in hashtab:
                    if isinstance(bucket, list):
                        env.value.update(dict(bucket))
            return env
        if kind in (LISTSXP, LANGSXP, CLOSXP, PROMSXP, DOTSXP):
            # a pairlist: read cell by cell (the cdr chain) into [(tag, value), ...]
            cells = []
            while True:
                if has_attr:
                    self.item()  # a cell's own attributes: unused by data sets
                tag = self.item() if has_tag else None
                cells.append((tag.name if isinstance(tag, RSymbol) else tag, self.item()))
                (flags,) = self.ints(1)
                kind = flags & 0xFF
                has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
                if kind not in (LISTSXP, LANGSXP, CLOSXP, PROMSXP, DOTSXP):
                    self.pos -= 4  # the chain ends with another item (usually NILVALUE)
                    self.item()
                    return cells
        if kind == CHARSXP:
            (n,) = self.ints(1)
            if n == -1:
                return None  # NA_character_
            raw = self.data[self.pos:self.pos + n]
            self.pos += n
            # bit 2 of the levels = LATIN1; otherwise UTF-8 or ASCII
            return raw.decode("latin-1" if (flags >> 12) & 4 else "utf-8")
        value = self.item_vector(kind)
        if has_attr:
            return RObject(value, self.pairlist_attrs(self.item()))
        return value

    def item_vector(self, kind: int) -> list:
        n = self.length()
        if kind in (LGLSXP, INTSXP):
            return [None if v == NA_INTEGER else v for v in self.ints(n)]
        if kind == REALSXP:
            out = list(struct.unpack_from(f">{n}d", self.data, self.pos))
            self.pos += 8 * n
            return out
        if kind in (STRSXP, VECSXP, EXPRSXP):
            return [self.item() for _ in range(n)]
        raise ValueError(f"R type {kind} is not supported by this small reader")


def unserialize(data: bytes) -> object:
    """Decode one object in R's XDR serialization format (versions 2 and 3)."""
    if data[:2] != b"X\n":
        raise ValueError(f"not an R XDR stream (starts with {data[:2]!r}; expected b'X\\n')")
    r = _Reader(data)
    r.pos = 2
    version, _writer, _min_reader = r.ints(3)
    if version == 3:
        (n,) = r.ints(1)
        r.pos += n  # native encoding name, e.g. "UTF-8"
    elif version != 2:
        raise ValueError(f"R serialization version {version} is not supported")
    return r.item()


def read_lazyload_record(blob: bytes) -> object:
    """One ``.rdb`` record: 4-byte big-endian raw length, then a zlib stream."""
    (n,) = struct.unpack(">I", blob[:4])
    raw = zlib.decompress(blob[4:])
    if len(raw) != n:
        raise ValueError(f"lazy-load record: expected {n} bytes, got {len(raw)}")
    return unserialize(raw)


def read_lazyload(stem: str | Path) -> dict[str, object]:
    """All objects of a lazy-load database, e.g. ``read_lazyload(".../data/Rdata")``.

    Returns ``{name: value}``; character vectors come back as lists of str.
    """
    stem = Path(stem)
    index = unserialize(gzip.decompress(stem.with_suffix(".rdx").read_bytes()))
    fields = dict(zip(index.attributes["names"], index.value, strict=True))
    variables = fields["variables"]
    blob = stem.with_suffix(".rdb").read_bytes()
    out = {}
    for name, where in zip(variables.attributes["names"], variables.value, strict=True):
        offset, length = where
        value = read_lazyload_record(blob[offset:offset + length])
        out[name] = value.value if isinstance(value, RObject) else value
    return out
