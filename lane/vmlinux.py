#!/usr/bin/env python3
"""Write the ELF kernel held inside an x86 bzImage to a file.

QEMU can enter such an ELF through its PVH note, so the guest skips its own
decompressor (seconds under software emulation). Usage: vmlinux.py BZIMAGE OUT
"""

from __future__ import annotations

import lzma
import os
import sys
import zlib

ELF_MAGIC = b"\x7fELF"


def _xz(blob: bytes) -> bytes:
    return lzma.LZMADecompressor().decompress(blob)


def _gzip(blob: bytes) -> bytes:
    return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(blob)


def find_elf(image: bytes) -> bytes:
    """Try each compressed stream start in IMAGE until one decompresses to an ELF file."""
    for magic, decompress in ((b"\xfd7zXZ\x00", _xz), (b"\x1f\x8b\x08", _gzip)):
        start = image.find(magic)
        while start >= 0:
            try:
                out = decompress(image[start:])
            except (lzma.LZMAError, zlib.error, EOFError):
                out = b""
            if out.startswith(ELF_MAGIC):
                return out
            start = image.find(magic, start + 1)
    raise SystemExit("vmlinux.py: no xz or gzip stream holding an ELF kernel was found")


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1], "rb") as f:
        elf = find_elf(f.read())
    if b"Linux version " not in elf:
        raise SystemExit("vmlinux.py: the ELF found is not a Linux kernel")
    tmp = argv[2] + ".part"
    with open(tmp, "wb") as f:
        f.write(elf)
    os.replace(tmp, argv[2])
    print(f"vmlinux.py: {argv[2]} ({len(elf) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
