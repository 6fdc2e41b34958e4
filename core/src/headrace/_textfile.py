"""Reading a definition file the user names (a pipeline TOML file, ``pipeline.yml``, a ``.sql``
library): a regular file, of bounded size, UTF-8, named in every error.

No third-party import: ``headrace validate`` and the pipelines loader use it.
"""

from __future__ import annotations

import os
import stat

from headrace.errors import HeadraceError

__all__ = ["MAX_DEFINITION_BYTES", "read_definition_file"]

MAX_DEFINITION_BYTES = 8 * 1024 * 1024
"""The largest definition file read (8 MiB): a pipeline's files are text a person writes, and a
device such as ``/dev/zero`` or a mistaken data file must not be read without end."""


def read_definition_file(path: str, what: str, *, error: type[HeadraceError] = HeadraceError,
                         folder_hint: str = "give the file itself", limit: int = MAX_DEFINITION_BYTES) -> str:  # fmt: skip
    """The text of the ``what`` (e.g. ``"pipeline file"``) at ``path``. Called once per file
    while a pipeline loads, on the caller's thread. Raises ``error`` naming the file for a
    missing file, a folder (``folder_hint`` is the fix it gives), a device, FIFO or socket
    (never opened for reading, so a FIFO cannot block), a file over ``limit`` bytes, or text
    that is not UTF-8."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{what} {path!r} does not exist") from None
    except OSError as e:
        raise error(f"{what} {path!r} cannot be read: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{what} {path!r} is a folder; {folder_hint}") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} {path!r} is not a regular file (a device, FIFO or socket); give a text file") from None
    try:
        # O_NONBLOCK: a FIFO swapped in after the check does not block the open
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise error(f"{what} {path!r} is not a regular file; give a text file")
            data = f.read(limit + 1)
    except OSError as e:
        raise error(f"{what} {path!r} cannot be read: {e.strerror or e}") from None
    if len(data) > limit:
        raise error(f"{what} {path!r} is larger than {limit // (1024 * 1024)} MiB; a definition file is text a "
                    "person writes: check that the path names the right file")  # fmt: skip
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} {path!r} is not UTF-8 text (byte {e.start} is {data[e.start:e.start + 1]!r}); "
                    "save it as UTF-8") from None  # fmt: skip
