"""The part of REAPI's ``ActionResult`` that hermetic writes to a remote action cache: output files.

bazel-remote validates every ``/ac/`` value as a ``build.bazel.remote.execution.v2.ActionResult`` protobuf
(unless started with ``--disable_http_ac_validation``), re-encodes it with its own ``execution_metadata``,
and answers 404 for an entry whose output files are missing from its CAS. So hermetic's action entries
*are* ActionResults: a list of ``OutputFile {path, Digest {hash, size_bytes}, is_executable}``, nothing
else (docs/remote.md). Three messages and four fields do not justify the protobuf runtime and generated
code; this is the wire format for them, from the field numbers of remote_execution.proto:

    ActionResult { repeated OutputFile output_files = 2; int32 exit_code = 4; ... }
    OutputFile   { string path = 1; Digest digest = 2; bool is_executable = 4; ... }
    Digest       { string hash = 1; int64 size_bytes = 2; }

Decoding skips every other field (bazel-remote adds ``execution_metadata = 9``) and rejects malformed
bytes with ValueError: a remote answer is untrusted input.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class OutputFile:
    path: str
    digest: str          # sha256, 64 lowercase hex digits
    size: int
    executable: bool = False


def encode_action_result(files: Sequence[OutputFile]) -> bytes:
    """A serialized ActionResult listing ``files`` (exit_code 0, the default, is not written)."""
    out = bytearray()
    for f in files:
        if not SHA256_RE.match(f.digest) or f.size < 0:
            raise ValueError(f"not a sha256 digest with a size: {f.digest!r} {f.size}")
        digest = _field(1, _LEN, f.digest.encode()) + _field(2, _VARINT, f.size)
        body = _field(1, _LEN, f.path.encode()) + _field(2, _LEN, digest)
        if f.executable:
            body += _field(4, _VARINT, 1)
        out += _field(2, _LEN, body)
    return bytes(out)


def decode_action_result(data: bytes) -> list[OutputFile]:
    """The output files of a serialized ActionResult; ValueError when the bytes are not one."""
    files = []
    for number, value in _fields(data):
        if number == 2:
            if not isinstance(value, bytes):
                raise ValueError("output_files is not a message")
            files.append(_output_file(value))
    return files


def _output_file(data: bytes) -> OutputFile:
    path, digest, size, executable = None, None, 0, False
    for number, value in _fields(data):
        if number == 1 and isinstance(value, bytes):
            path = value.decode()
        elif number == 2 and isinstance(value, bytes):
            for n, v in _fields(value):
                if n == 1 and isinstance(v, bytes):
                    digest = v.decode()
                elif n == 2 and isinstance(v, int):
                    size = v
        elif number == 4 and isinstance(value, int):
            executable = bool(value)
    if path is None or digest is None or not SHA256_RE.match(digest) or size < 0:
        raise ValueError("an output file without a path or a sha256 digest")
    return OutputFile(path, digest, size, executable)


def _field(number: int, wire: int, value: int | bytes) -> bytes:
    if wire == _VARINT:
        assert isinstance(value, int)
        return _varint(number << 3 | wire) + _varint(value)
    assert isinstance(value, bytes)
    return _varint(number << 3 | wire) + _varint(len(value)) + value


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64  # negative int64 values take ten bytes, as protobuf writes them
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or oversized varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of each field: an int for varints, bytes for length-delimited fields."""
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire == _VARINT:
            value, pos = _read_varint(data, pos)
            yield number, value
        elif wire == _LEN:
            length, pos = _read_varint(data, pos)
            if pos + length > len(data):
                raise ValueError("a field runs past the end")
            yield number, data[pos:pos + length]
            pos += length
        elif wire in (_I64, _I32):
            pos += 8 if wire == _I64 else 4
            if pos > len(data):
                raise ValueError("a fixed-width field runs past the end")
        else:
            raise ValueError(f"unsupported wire type {wire}")
