"""Writing one Parquet file so that no reader ever sees half of it.

The table is written under ``<root>/.incoming/`` (same file system, hidden from readers
of the forms' folders), flushed to disk (``fsync``), renamed into its folder in one step,
and the folder's entry is flushed too. A failure removes the temporary file and raises.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

INCOMING = ".incoming"


def load_parquet() -> None:
    """Import pyarrow's Parquet writer and what pyarrow imports lazily at its first use (see
    ``ExperienceLog``): the first array built from numpy imports pandas and pyarrow.compute,
    which in the writer thread cost a second and a half of CPU under load and, imported after
    ``gc.freeze``, left every full collection scanning pandas from then on (measured).

    Called before anything else of the process imports pyarrow, it also picks the allocator
    Arrow's C++ code uses for good (``ARROW_DEFAULT_MEMORY_POOL``, unless set): the C
    library's. Arrow's own default, mimalloc, hands a file's freed buffers back to the system
    at once, so each file (one a second) faulted in and zeroed fresh 2 MB pages, about a fifth
    of the writer thread's CPU; the C library's allocator keeps them for the next file
    (docs/benchmarks-history.md has the runs)."""
    if "pyarrow" not in sys.modules:
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    import io

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    column = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(2, np.float32)), 2).cast(pa.list_(pa.float32(), 2))
    pq.write_table(pa.table({"x": column, "s": pa.array(["a"], pa.string())}), io.BytesIO(), compression="none",
                   use_dictionary=False, write_statistics=False)


def write_table(table: Any, path: Path, incoming: Path) -> None:
    """Write the pyarrow ``table`` to ``path`` atomically (uncompressed: the episodes
    form's ``item`` bytes are read as they are, and cartpole-sized rows gain little)."""
    import pyarrow.parquet as pq

    incoming.mkdir(parents=True, exist_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = incoming / f"{path.name}.tmp"
    try:
        with open(temporary, "wb") as handle:
            # No dictionary pages or statistics: most columns are unique per row (ids, floats),
            # and building them for nothing doubled the write's CPU.
            pq.write_table(table, handle, compression="none", use_dictionary=False, write_statistics=False)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (the folder's entry), where the system allows it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
