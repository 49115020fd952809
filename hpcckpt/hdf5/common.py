"""What the HDF5 export and import share: the h5py import, the file signature, error mapping, constants."""

from __future__ import annotations

import contextlib
import os


from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.storage.posix import open_regular


#: The first 8 bytes of an HDF5 superblock; found at offset 0, 512, 1024, 2048... (after a user block).
SIGNATURE = b"\x89HDF\r\n\x1a\n"
#: Suffix of the root attribute that holds a replicated value as JSON text.
JSON_SUFFIX = ".json"
#: Prefix of the root attributes that describe an export; no replicated value may use it.
RESERVED_PREFIX = "hpcckpt."
#: Library format bounds of exported files: dense attribute storage (attributes over 64 KiB,
#: replicated arrays may reach 1 MiB) while staying readable by HDF5 1.10 (h5dump of Debian 12).
LIBVER = ("v108", "v110")
#: Largest temporary buffer when a hyperslab must be read into a non-contiguous block.
SLAB_BYTES = 64 << 20
#: The range of the 64-bit integer attributes (``hpcckpt.step``, plain int values).
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def h5py_module():
    try:
        import h5py
    except ImportError:
        raise CheckpointError("HDF5 support needs h5py: pip install 'hpcckpt[hdf5]' (or h5py>=3.8)") from None
    return h5py


def is_hdf5(path) -> bool:
    """True when ``path`` is a regular file with the HDF5 signature (at offset 0 or after a user block)."""
    try:
        fd = open_regular(os.fspath(path))  # a FIFO must not block the check
    except (OSError, CheckpointError, ValueError, TypeError):
        return False
    try:
        size = os.fstat(fd).st_size
        offset = 0
        while offset + len(SIGNATURE) <= size:
            if os.pread(fd, len(SIGNATURE), offset) == SIGNATURE:
                return True
            offset = 512 if offset == 0 else offset * 2
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


@contextlib.contextmanager
def h5_errors(what: str, corrupt: bool = True):
    """Turn h5py's exceptions into CheckpointError (CorruptCheckpointError for unreadable content)."""
    try:
        yield
    except CheckpointError:
        raise
    except FileNotFoundError:
        raise CheckpointError(f"{what}: no such file") from None
    except PermissionError as exc:
        raise CheckpointError(f"{what}: {exc.strerror or exc}") from None
    except (OSError, KeyError, RuntimeError, ValueError, TypeError, IndexError) as exc:
        cls = CorruptCheckpointError if corrupt else CheckpointError
        raise cls(f"{what}: {' '.join(str(exc).split()) or type(exc).__name__}") from None


def open_read(path: str):
    """Open an HDF5 file read-only with serial h5py (file locking where the file system supports it)."""
    h5py = h5py_module()
    if not is_hdf5(path):
        if not os.path.exists(path):
            raise CheckpointError(f"{path!r}: no such file")
        if not os.path.isfile(path):
            raise CheckpointError(f"{path!r} is not a file")
        if not os.access(path, os.R_OK):
            raise CheckpointError(f"{path!r}: permission denied")
        raise CorruptCheckpointError(f"{path!r} is not an HDF5 file (no HDF5 signature)")
    with h5_errors(f"cannot open {path!r} as HDF5"):
        try:
            return h5py.File(path, "r", locking="best-effort")
        except ValueError:  # an HDF5 older than 1.12.1 has no best-effort locking
            return h5py.File(path, "r")
