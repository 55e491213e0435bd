"""TFTP read requests: parsing, option negotiation (RFC 2347/2348/2349/7440), and opening the
named file read-only without leaving the root (no `..`, no symlink out, regular files only).
"""

from __future__ import annotations

import errno
import os
import stat
import struct

from provisiond.errors import InvalidInput

RRQ, WRQ, DATA, ACK, ERROR, OACK = 1, 2, 3, 4, 5, 6
NOT_DEFINED, NOT_FOUND, ACCESS_VIOLATION, ILLEGAL = 0, 1, 2, 4
MAX_BLKSIZE = 65464  # RFC 2348
MAX_WINDOW = 64  # RFC 7440 lets a client ask for 65535 blocks in flight; we allow this many
HEADER = struct.Struct(">HH")  # opcode, block number or error code
NO_FILE, DENIED = (NOT_FOUND, "file not found"), (ACCESS_VIOLATION, "permission denied")
OPEN_REFUSALS = {errno.ENOENT: NO_FILE, errno.ENOTDIR: NO_FILE, errno.EISDIR: NO_FILE,
                 errno.ENAMETOOLONG: NO_FILE, errno.ELOOP: NO_FILE, errno.EACCES: DENIED,
                 errno.EPERM: DENIED}  # open() failures a client is told of; others drop it


class Refused(InvalidInput):
    """A request answered with a TFTP error (code, message) and no transfer."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def refusal(filename: str) -> str | None:
    """Why a requested name is refused, or None if it may be looked up under the root."""
    if filename.startswith("/") or filename.startswith("\\"):
        return "absolute paths are refused"
    if any(part == ".." for part in filename.replace("\\", "/").split("/")):
        return "'..' is refused"
    if "\0" in filename or not filename:
        return "bad file name"
    return None


def error_packet(code: int, message: str) -> bytes:
    return HEADER.pack(ERROR, code) + message.encode()[:200] + b"\0"


def parse_request(packet: bytes) -> tuple[str, str, dict[str, str]]:
    """(file name, mode, options) of a read request; Refused if it is not a valid one."""
    opcode = int.from_bytes(packet[:2], "big")
    if opcode == WRQ:
        raise Refused(ACCESS_VIOLATION, "writes are refused")
    fields = packet[2:].split(b"\0")
    if opcode != RRQ or len(fields) < 3 or fields[-1]:
        raise Refused(ILLEGAL, "not a read request")
    try:
        name, mode, *rest = (field.decode() for field in fields[:-1])
    except UnicodeDecodeError:
        raise Refused(ILLEGAL, "file name or option is not UTF-8") from None
    if mode.lower() not in ("octet", "netascii"):
        raise Refused(ILLEGAL, f"mode {mode[:20]!r} is not served")
    why = refusal(name)
    if why:
        raise Refused(ACCESS_VIOLATION, why)
    options = {key.lower(): value for key, value in zip(rest[::2], rest[1::2])}
    return name, mode, options


def number(value: str) -> int | None:
    """An option's value as a number, or None: ASCII digits only (str.isdigit also takes
    '²', which int() refuses, and int() refuses more than 4300 digits), 20 at most."""
    if value.isascii() and value.isdigit() and len(value) <= 20:
        return int(value)
    return None


def negotiate(asked: dict[str, str], size: int) -> dict[str, int]:
    """The options we take, with their values (RFC 2347: the others are ignored).

    blksize and windowsize may be lowered to what we allow; a bad value drops its option."""
    taken = {}
    for key, low, high in (("blksize", 8, MAX_BLKSIZE), ("windowsize", 1, MAX_WINDOW),
                           ("timeout", 1, 255)):
        value = number(asked.get(key, ""))
        if value is not None and value >= low and (key != "timeout" or value <= high):
            taken[key] = min(value, high)
    if "tsize" in asked:
        taken["tsize"] = size
    return taken


def open_under(root: str, name: str) -> int:
    """A read-only descriptor for regular file `name` under `root`; Refused otherwise."""
    real_root = os.path.realpath(root)
    path = os.path.realpath(os.path.join(real_root, name))
    if os.path.commonpath([real_root, path]) != real_root:
        raise Refused(ACCESS_VIOLATION, "outside the root")
    try:  # O_NONBLOCK: a FIFO under the root must not block the loop
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno not in OPEN_REFUSALS:
            raise  # out of descriptors or memory: the caller drops the request
        raise Refused(*OPEN_REFUSALS[exc.errno]) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Refused(*NO_FILE)
    return fd
