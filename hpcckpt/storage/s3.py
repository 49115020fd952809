"""A Storage on an S3-compatible object store (AWS S3, Ceph's RADOS gateway, MinIO...) through boto3.

Paths are ``s3://bucket/key/...``; ``s3:/bucket/...`` (what ``os.path.normpath``
makes of one) is read the same.  The endpoint, the credentials and the region
come from boto3's usual places: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``~/.aws/config`` and
``~/.aws/credentials`` (docs/storage.md).

Why boto3 and not s3fs/fsspec: the commit protocol and the writer lock need
conditional writes (``If-None-Match: *``) and per-object metadata (an identity
that survives a copy), and the reads need ranged GETs into a caller's buffer;
boto3 exposes each as one request, s3fs hides them behind a file-like object
(with its own cache, listing cache and retries) and adds aiobotocore, fsspec
and an event loop per process for no gain here.

How the interface maps onto objects (an object store has no directories, no
rename, no links, no writes in place):

* A directory is its marker object ``key/`` (empty), or implicit where objects
  exist under ``key/``.  ``make_version`` writes the marker with
  ``If-None-Match: *``: of two writers exactly one gets the version.
* ``create`` writes an empty object with ``If-None-Match: *`` (FileExistsError
  for the second), then the handle collects the bytes: appends stream out as
  multipart parts of ``part_bytes`` (at most ``max_in_flight`` requests at once);
  a file that stays smaller is one PUT at ``close`` (or at ``sync``).  Writes in
  place (``write_at``, ``truncate``) reach only bytes not yet sent.
* Every object hpcckpt writes carries ``x-amz-meta-hpcckpt-id``, a fresh random
  id per file: ``Stat.identity`` and ``names_handle`` compare it (a copy keeps
  it, as a rename keeps an inode).
* ``atomic_write`` is one PUT (readers see the old object or the new one);
  ``replace`` is a copy then a delete of the source (the target is never
  missing, the source briefly has two names); ``link`` is a copy.
* A version is committed when its ``metadata.json`` exists and verifies; the
  commit (storage/commit.py) writes it after every rank closed its data
  objects, so it is the last object written.
* Reads: ``read_segments`` splits a run into ranged GETs of ``part_bytes``,
  ``max_in_flight`` at once, each read straight into its slice of the
  caller's buffer (``If-Match`` the ETag seen at ``open_read``).

``requests`` counts the requests made, by kind (bench and tests read it).
"""

from __future__ import annotations

import errno
import posixpath
import re
import threading
import uuid
from collections import Counter

from hpcckpt.core.names import METADATA_FILE, split_reference
from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.format.metadata import check_relative_path
from hpcckpt.storage.base import DIRECTORY, FILE, Stat, Storage, check_position, copy_through_buffer, hash_segments

SCHEME = "s3://"
_PATH = re.compile(r"^s3:/+([^/]+)/*(.*)$")
#: user metadata key of the identity of a file (x-amz-meta-hpcckpt-id)
ID_KEY = "hpcckpt-id"
MiB = 1 << 20


def is_s3_path(path) -> bool:
    return isinstance(path, str) and _PATH.match(path) is not None and path.startswith("s3:/")


def split_path(path: str) -> tuple[str, str]:
    """``(bucket, key)`` of ``s3://bucket/key`` (key normalised, no leading or trailing slash; "" for the bucket)."""
    m = _PATH.match(str(path))
    if m is None:
        raise CheckpointError(f"{path!r} is not an s3://bucket/key path")
    key = posixpath.normpath("/" + m.group(2)).lstrip("/")
    return m.group(1), "" if key == "." else key


def join(bucket: str, key: str) -> str:
    return f"{SCHEME}{bucket}/{key}" if key else f"{SCHEME}{bucket}"


class _Writer:
    """A file being written: bytes ``[base, base + len(buf))`` still here (those before ``base`` sent as parts),
    where the next append writes, and the multipart upload once one is started."""

    def __init__(self, bucket: str, key: str, ident: str):
        self.bucket, self.key, self.ident = bucket, key, ident
        self.buf = bytearray()
        self.base = self.position = 0
        self.upload_id = None
        self.parts: list = []  # futures of (PartNumber, ETag)
        self.in_place = False  # write_at/truncate made bytes past the append position: stop streaming
        self.dirty = False  # bytes written since the object last got them (create, sync): close sends them
        self.closed = False


class _Reader:
    def __init__(self, bucket: str, key: str, size: int, etag: str):
        self.bucket, self.key, self.size, self.etag = bucket, key, size, etag


def _byte_view(buffer) -> memoryview:
    view = memoryview(buffer)
    return view if view.ndim == 1 and view.format == "B" else view.cast("B")


class S3Storage(Storage):
    """Versions as objects in S3 buckets; one instance serves any bucket of one endpoint."""

    durable = True  # an object is stored durably when its PUT (or the multipart completion) returns
    shared_paths = True  # every process sees an object once it is written: aggregated runs
    shared_files = False  # one writer per object: no shared-file
    conditional_writes = True  # PUT with If-Match: the writer lock is a lease (hpcckpt.root.lock)

    def __init__(self, client=None, *, part_bytes: int = 8 * MiB, max_in_flight: int = 8):
        if part_bytes < 5 * MiB:
            raise CheckpointError(f"part_bytes must be at least 5 MiB (S3's smallest multipart part), got {part_bytes}")
        self._client = client
        self.part_bytes = part_bytes
        self.max_in_flight = max_in_flight
        self.requests: Counter = Counter()
        self._lock = threading.Lock()
        self._pool = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state.update(_client=None, _pool=None, _lock=None, requests=Counter())
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ------------------------------------------------------------ plumbing
    @property
    def client(self):
        if self._client is None:
            import boto3
            from botocore.config import Config

            self._client = boto3.client("s3", config=Config(max_pool_connections=self.max_in_flight + 4,
                                                            retries={"mode": "standard"}))
        return self._client

    @property
    def pool(self):
        """The threads of the requests in flight (``max_in_flight``); concurrent.futures is imported here, not with
        the module, which a restart imports (it imports logging: tests/docs/test_restart_imports.py)."""
        from concurrent.futures import ThreadPoolExecutor

        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_in_flight, thread_name_prefix="hpcckpt-s3")
            return self._pool

    def _call(self, op: str, **kwargs):
        """One request: ``op`` of the boto3 client (counted); ClientErrors become OSErrors."""
        from botocore.exceptions import BotoCoreError, ClientError

        with self._lock:
            self.requests[op] += 1
        try:
            return getattr(self.client, op)(**kwargs)
        except ClientError as exc:
            raise _os_error(exc, kwargs) from None
        except BotoCoreError as exc:
            raise OSError(errno.EIO, f"{op} of {_where(kwargs)}: {exc}") from None

    def _head(self, bucket: str, key: str):
        """The HEAD of object ``key``, or None when there is none."""
        if not key:
            return None
        try:
            return self._call("head_object", Bucket=bucket, Key=key)
        except FileNotFoundError:
            return None

    def _is_dir(self, bucket: str, key: str) -> bool:
        """Whether a marker ``key/`` or any object under ``key/`` exists (the bucket itself: whether it exists)."""
        if not key:
            try:
                self._call("head_bucket", Bucket=bucket)
                return True
            except FileNotFoundError:
                return False
        out = self._call("list_objects_v2", Bucket=bucket, Prefix=key + "/", MaxKeys=1)
        return out.get("KeyCount", 0) > 0

    def _keys_under(self, bucket: str, prefix: str):
        """Every key that starts with ``prefix``."""
        kwargs = {"Bucket": bucket, "Prefix": prefix}
        while True:
            out = self._call("list_objects_v2", **kwargs)
            for obj in out.get("Contents", ()):
                yield obj["Key"]
            if not out.get("IsTruncated"):
                return
            kwargs["ContinuationToken"] = out["NextContinuationToken"]

    def _delete_keys(self, bucket: str, keys) -> None:
        keys = list(keys)
        for lo in range(0, len(keys), 1000):
            out = self._call("delete_objects", Bucket=bucket,
                             Delete={"Objects": [{"Key": k} for k in keys[lo:lo + 1000]], "Quiet": True})
            if out.get("Errors"):
                err = out["Errors"][0]
                raise OSError(errno.EIO, f"cannot delete s3://{bucket}/{err['Key']}: {err.get('Message')}")

    def _abort_uploads(self, bucket: str, prefix: str) -> None:
        """Abort the multipart uploads left under ``prefix`` (a writer killed mid-file): their parts are stored,
        and billed, until aborted, yet no listing of objects shows them."""
        kwargs = {"Bucket": bucket, "Prefix": prefix}
        while True:
            out = self._call("list_multipart_uploads", **kwargs)
            for up in out.get("Uploads", ()):
                try:
                    self._call("abort_multipart_upload", Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
                except FileNotFoundError:  # completed or aborted meanwhile
                    pass
            if not out.get("IsTruncated"):
                return
            kwargs.update(KeyMarker=out["NextKeyMarker"], UploadIdMarker=out["NextUploadIdMarker"])

    def _put(self, bucket: str, key: str, body, ident: str | None = None, exclusive: bool = False) -> None:
        kwargs = {"Bucket": bucket, "Key": key, "Body": body, "Metadata": {ID_KEY: ident or uuid.uuid4().hex}}
        if exclusive:
            kwargs["IfNoneMatch"] = "*"
        self._call("put_object", **kwargs)

    def _copy(self, bucket: str, source: str, target: str, size: int) -> None:
        if size <= 5 << 30:
            self._call("copy_object", Bucket=bucket, Key=target, CopySource={"Bucket": bucket, "Key": source})
        else:  # over 5 GiB: the managed copy (multipart, metadata kept)
            with self._lock:
                self.requests["copy (managed)"] += 1
            self.client.copy({"Bucket": bucket, "Key": source}, bucket, target)

    def _missing(self, bucket: str, key: str, path: str):
        """The error for a file that is not there: a directory is damage (CorruptCheckpointError), else absent."""
        if self._is_dir(bucket, key):
            return CorruptCheckpointError(f"{path} is a directory, not a regular file")
        return FileNotFoundError(errno.ENOENT, "No such file or directory", path)

    # ----------------------------------------------------------------- save
    def make_version(self, directory: str) -> None:
        bucket, key = split_path(directory)
        if self._head(bucket, key) is not None or self._is_dir(bucket, key):
            raise FileExistsError(errno.EEXIST, "File exists", directory)
        try:
            self._put(bucket, key + "/", b"", exclusive=True)  # the arbiter: one of two writers gets it
        except FileExistsError:
            raise FileExistsError(errno.EEXIST, "File exists", directory) from None
        self._put(bucket, key + "/data/", b"")

    def create(self, path: str) -> _Writer:
        bucket, key = split_path(path)
        ident = uuid.uuid4().hex
        try:
            self._put(bucket, key, b"", ident, exclusive=True)
        except FileExistsError:
            raise FileExistsError(errno.EEXIST, "File exists", path) from None
        return _Writer(bucket, key, ident)

    def append(self, handle: _Writer, buffer, hasher=None) -> int:
        view = _byte_view(buffer)
        self._write(handle, handle.position, view)
        handle.position += len(view)
        if hasher is not None:
            hasher.update(view)
        self._stream(handle)
        return len(view)

    def _write(self, handle: _Writer, offset: int, view: memoryview) -> None:
        if handle.closed:
            raise OSError(errno.EBADF, f"s3://{handle.bucket}/{handle.key} is closed")
        at = offset - handle.base
        if at < 0:
            raise OSError(errno.ENOTSUP, f"s3://{handle.bucket}/{handle.key}: bytes before {handle.base} were "
                                         "already sent to the object store and cannot be rewritten")
        buf = handle.buf
        if at > len(buf):
            buf.extend(bytes(at - len(buf)))
        buf[at:at + len(view)] = view
        handle.dirty = True

    def _stream(self, handle: _Writer) -> None:
        """Send full parts of the appended bytes while two parts' worth wait (the last part stays for close)."""
        if handle.in_place:
            return
        size = self.part_bytes
        while handle.position - handle.base >= 2 * size and len(handle.buf) == handle.position - handle.base:
            if handle.upload_id is None:
                handle.upload_id = self._call("create_multipart_upload", Bucket=handle.bucket, Key=handle.key,
                                              Metadata={ID_KEY: handle.ident})["UploadId"]
            self._send_part(handle, bytes(handle.buf[:size]))
            del handle.buf[:size]
            handle.base += size

    def _send_part(self, handle: _Writer, body: bytes) -> None:
        number = len(handle.parts) + 1
        from concurrent.futures import FIRST_COMPLETED, wait

        pending = [f for f in handle.parts if not f.done()]
        if len(pending) >= self.max_in_flight:  # bounded: wait for one to finish (a failure is raised at close)
            wait(pending, return_when=FIRST_COMPLETED)

        def send():
            out = self._call("upload_part", Bucket=handle.bucket, Key=handle.key, UploadId=handle.upload_id,
                             PartNumber=number, Body=body)
            return {"PartNumber": number, "ETag": out["ETag"]}

        handle.parts.append(self.pool.submit(send))

    def close(self, handle: _Writer, fsync: bool) -> None:
        if handle.closed:
            return
        handle.closed = True
        if handle.upload_id is None:  # a file removed or renamed after its last sync is not written again
            if handle.dirty:
                self._put(handle.bucket, handle.key, bytes(handle.buf), handle.ident)
            handle.buf = bytearray()
            return
        try:
            if handle.buf:
                self._send_part(handle, bytes(handle.buf))
            parts = [f.result() for f in handle.parts]
            self._call("complete_multipart_upload", Bucket=handle.bucket, Key=handle.key,
                       UploadId=handle.upload_id, MultipartUpload={"Parts": parts})
        except BaseException:
            try:
                self._call("abort_multipart_upload", Bucket=handle.bucket, Key=handle.key, UploadId=handle.upload_id)
            except OSError:
                pass
            raise
        finally:
            handle.buf = bytearray()

    def atomic_write(self, path: str, data: bytes, fsync: bool = True) -> None:
        bucket, key = split_path(path)
        self._put(bucket, key, bytes(data))

    def sync_directory(self, path: str) -> None:
        pass  # no directory entries to make durable: an object is durable when its PUT returns

    # ----------------------------------------------------------------- load
    def read_file(self, path: str, limit: int) -> bytes:
        bucket, key = split_path(path)
        out = self._call("get_object", Bucket=bucket, Key=key)
        body = out["Body"]
        try:
            if out["ContentLength"] > limit:
                raise CorruptCheckpointError(f"{path} is longer than {limit} bytes, more than any real one")
            return body.read()
        finally:
            body.close()

    def resolve(self, directory: str, name: str, roots: dict | None = None) -> str:
        check_relative_path(name)
        bucket, own = split_path(directory)
        ref = split_reference(name)
        if ref is None:
            root, rest = own, name
        else:
            parent = posixpath.dirname(own)
            root, rest = posixpath.normpath(posixpath.join(parent, ref[0])).lstrip("/"), ref[1]
            if posixpath.dirname(root) != parent:
                raise CorruptCheckpointError(f"data file {name!r} refers to a version outside {join(bucket, parent)}")
            roots = {} if roots is None else roots
            if root not in roots:
                roots[root] = self._head(bucket, posixpath.join(root, METADATA_FILE)) is not None
            if not roots[root]:
                raise CorruptCheckpointError(f"data file {name!r} refers to {join(bucket, root)}, which is not a "
                                             "committed version (removed or never committed)")
        full = posixpath.normpath(posixpath.join("/", root, rest)).lstrip("/")
        if not full.startswith(root + "/"):
            raise CorruptCheckpointError(f"data file {rest!r} resolves outside the checkpoint directory")
        return join(bucket, full)

    def open_read(self, path: str) -> tuple[_Reader, int]:
        bucket, key = split_path(path)
        head = self._head(bucket, key)
        if head is None:
            raise self._missing(bucket, key, path)
        return _Reader(bucket, key, head["ContentLength"], head["ETag"]), head["ContentLength"]

    def _get_into(self, handle: _Reader, offset: int, view: memoryview) -> None:
        """Fill ``view`` with bytes ``[offset, offset + len(view))`` of the object: one ranged GET."""
        out = self._call("get_object", Bucket=handle.bucket, Key=handle.key, IfMatch=handle.etag,
                         Range=f"bytes={offset}-{offset + len(view) - 1}")
        body = out["Body"]
        try:
            raw = getattr(body, "_raw_stream", None)
            got = 0
            while got < len(view):
                if raw is not None and hasattr(raw, "readinto"):
                    n = raw.readinto(view[got:])
                else:
                    chunk = body.read(len(view) - got)
                    n = len(chunk)
                    view[got:got + n] = chunk
                if not n:
                    break
                got += n
        finally:
            body.close()
        if got != len(view):
            raise CorruptCheckpointError(f"s3://{handle.bucket}/{handle.key}: a ranged read at {offset} returned "
                                         f"{got} of {len(view)} bytes")

    def read_segments(self, handle: _Reader, offset: int, buffer, name: str, segments) -> None:
        view = _byte_view(buffer)
        n = len(view)
        if offset + n > handle.size:
            raise CorruptCheckpointError(f"{name} is truncated: wanted {n} bytes at offset {offset}, "
                                         f"the file ends after {max(0, handle.size - offset)}")
        step = self.part_bytes
        pieces = [(lo, min(n, lo + step)) for lo in range(0, n, step)]
        if len(pieces) <= 1:
            if n:
                self._get_into(handle, offset, view)
        else:  # bounded in flight: the pool has max_in_flight threads
            futures = [self.pool.submit(self._get_into, handle, offset + lo, view[lo:hi]) for lo, hi in pieces]
            for f in futures:
                f.result()
        hash_segments(view, segments)

    def close_read(self, handle) -> None:
        pass

    # ------------------------------------------------------- bookkeeping
    def exists(self, path: str) -> bool:
        bucket, key = split_path(path)
        return self._head(bucket, key) is not None or self._is_dir(bucket, key)

    def listdir(self, path: str) -> list[str]:
        bucket, key = split_path(path)
        prefix = key + "/" if key else ""
        kwargs = {"Bucket": bucket, "Prefix": prefix, "Delimiter": "/"}
        names, found = set(), not key
        while True:
            out = self._call("list_objects_v2", **kwargs)
            for p in out.get("CommonPrefixes", ()):
                names.add(p["Prefix"][len(prefix):].rstrip("/"))
                found = True
            for obj in out.get("Contents", ()):
                found = True
                if obj["Key"] != prefix:
                    names.add(obj["Key"][len(prefix):])
            if not out.get("IsTruncated"):
                break
            kwargs["ContinuationToken"] = out["NextContinuationToken"]
        if not found:
            if self._head(bucket, key) is not None:
                raise NotADirectoryError(errno.ENOTDIR, "Not a directory", path)
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        return sorted(names)

    def remove(self, path: str) -> None:
        bucket, key = split_path(path)
        if not key:
            raise CheckpointError(f"refusing to remove the whole bucket {bucket}")
        keys = list(self._keys_under(bucket, key + "/"))
        if self._head(bucket, key) is not None:
            keys.append(key)
        self._delete_keys(bucket, keys)
        self._abort_uploads(bucket, key + "/")

    # ------------------------------------------------------------- root
    def stat(self, path: str, follow: bool = False) -> Stat | None:
        bucket, key = split_path(path)
        head = self._head(bucket, key)
        if head is not None:
            ident = head.get("Metadata", {}).get(ID_KEY) or head["ETag"]
            modified = int(head["LastModified"].timestamp() * 1e9)
            return Stat(FILE, head["ContentLength"], (ident,), modified, tag=head["ETag"])
        if self._is_dir(bucket, key):
            return Stat(DIRECTORY, 0, ("dir", bucket, key))
        parent = posixpath.dirname(key)  # nothing there: NotADirectoryError if a file is on the way
        while parent:
            if self._head(bucket, parent) is not None:
                raise NotADirectoryError(errno.ENOTDIR, "Not a directory", path)
            if self._is_dir(bucket, parent):
                break
            parent = posixpath.dirname(parent)
        return None

    def realpath(self, path: str) -> str:
        return join(*split_path(path))

    def make_directories(self, path: str) -> None:
        bucket, key = split_path(path)
        if not key:
            if not self._is_dir(bucket, key):
                raise FileNotFoundError(errno.ENOENT, f"no bucket {bucket!r} (hpcckpt does not create buckets)", path)
            return
        if self._head(bucket, key) is not None:
            raise FileExistsError(errno.EEXIST, "File exists", path)
        parts = key.split("/")
        for i in range(1, len(parts)):
            if self._head(bucket, "/".join(parts[:i])) is not None:
                raise NotADirectoryError(errno.ENOTDIR, "Not a directory", path)
        for i in range(1, len(parts) + 1):
            self._put(bucket, "/".join(parts[:i]) + "/", b"")

    def replace(self, source: str, target: str) -> None:
        bucket, src = split_path(source)
        tbucket, dst = split_path(target)
        if tbucket != bucket:
            raise OSError(errno.EXDEV, "Invalid cross-bucket link", target)
        head = self._head(bucket, src)
        if src == dst and (head is not None or self._is_dir(bucket, src)):
            return
        if head is not None:
            if self._is_dir(bucket, dst):
                raise IsADirectoryError(errno.EISDIR, "Is a directory", target)
            self._copy(bucket, src, dst, head["ContentLength"])
            self._delete_keys(bucket, [src])
        elif self._is_dir(bucket, src):
            self._replace_directory(bucket, src, dst, target)
        else:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", source)

    def _replace_directory(self, bucket: str, src: str, dst: str, target: str) -> None:
        if not src or dst.startswith(src + "/"):
            raise OSError(errno.EINVAL, "Invalid argument", target)
        if self._head(bucket, dst) is not None:
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory", target)
        if self._is_dir(bucket, dst):
            if self.listdir(target):
                raise OSError(errno.ENOTEMPTY, "Directory not empty", target)
            self._delete_keys(bucket, [dst + "/"])
        keys = list(self._keys_under(bucket, src + "/"))
        for k in keys:  # every object copied before any is removed: the tree is never half gone
            self._copy(bucket, k, dst + k[len(src):], 0)
        self._delete_keys(bucket, keys)

    def link(self, source: str, target: str) -> None:
        bucket, src = split_path(source)
        _, dst = split_path(target)
        head = self._head(bucket, src)
        if head is None:
            if self._is_dir(bucket, src):
                raise PermissionError(errno.EPERM, "Operation not permitted", source)
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", source)
        if self.exists(target):
            raise FileExistsError(errno.EEXIST, "File exists", target)
        self._copy(bucket, src, dst, head["ContentLength"])  # no hard links: a copy, the identity kept

    def remove_file(self, path: str) -> None:
        bucket, key = split_path(path)
        if self._head(bucket, key) is None:
            if self._is_dir(bucket, key):
                raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        self._delete_keys(bucket, [key])

    def remove_directory(self, path: str) -> None:
        bucket, key = split_path(path)
        if self._head(bucket, key) is not None:
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory", path)
        if not key:
            raise CheckpointError(f"refusing to remove the bucket {bucket}")
        out = self._call("list_objects_v2", Bucket=bucket, Prefix=key + "/", MaxKeys=2)
        keys = [o["Key"] for o in out.get("Contents", ())]
        if not keys:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        if keys != [key + "/"]:
            raise OSError(errno.ENOTEMPTY, "Directory not empty", path)
        self._delete_keys(bucket, keys)

    def remove_tree(self, path: str) -> None:
        bucket, key = split_path(path)
        if self._head(bucket, key) is not None:
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory", path)
        if not key:
            raise CheckpointError(f"refusing to remove the bucket {bucket}")
        self._delete_keys(bucket, list(self._keys_under(bucket, key + "/")))
        self._abort_uploads(bucket, key + "/")

    def read_head(self, path: str, nbytes: int) -> bytes:
        bucket, key = split_path(path)
        try:
            out = self._call("get_object", Bucket=bucket, Key=key, Range=f"bytes=0-{max(nbytes, 1) - 1}")
        except FileNotFoundError:
            raise self._missing(bucket, key, path) from None
        except OSError as exc:
            if getattr(exc, "s3_code", None) == "InvalidRange":  # an empty object
                return b""
            raise CheckpointError(f"cannot read {path}: {exc}") from None
        body = out["Body"]
        try:
            return body.read()[:nbytes]
        finally:
            body.close()

    def sync(self, handle: _Writer) -> None:
        """Make the bytes so far the object's content (one PUT); a file streaming as multipart parts becomes
        visible, and durable, only when closed."""
        if handle.upload_id is None and not handle.closed and handle.dirty:
            self._put(handle.bucket, handle.key, bytes(handle.buf), handle.ident)
            handle.dirty = False

    def write_if_unchanged(self, path: str, data: bytes, seen: Stat) -> bool:
        """One PUT with ``If-Match`` the ETag of ``seen``.  Ceph's gateway (16) compares the header with its
        stored ETag, which has no quotes, and refuses the quoted form RFC 7232 and AWS use; so the bare ETag goes
        first, and the quoted one only when a HEAD shows the object unchanged after a refusal (a refusal for a
        changed object stays one: the second PUT is conditional too)."""
        bucket, key = split_path(path)
        if seen.tag is None:
            return False
        for etag in (seen.tag.strip('"'), seen.tag):
            try:
                self._call("put_object", Bucket=bucket, Key=key, Body=bytes(data), IfMatch=etag,
                           Metadata={ID_KEY: uuid.uuid4().hex})
                return True
            except FileNotFoundError:
                return False
            except OSError as exc:
                if getattr(exc, "s3_code", None) not in ("PreconditionFailed", "412"):
                    raise
            head = self._head(bucket, key)
            if head is None or head["ETag"] != seen.tag:
                return False
        return False

    def names_handle(self, path: str, handle: _Writer) -> bool:
        bucket, key = split_path(path)
        head = self._head(bucket, key)
        return head is not None and bucket == handle.bucket and head.get("Metadata", {}).get(ID_KEY) == handle.ident

    # ------------------------------------------------------- files written in place
    def create_replacing(self, path: str) -> _Writer:
        bucket, key = split_path(path)
        if self._head(bucket, key) is not None:
            self._delete_keys(bucket, [key])
        elif self._is_dir(bucket, key):
            raise CorruptCheckpointError(f"{path} is a directory, not a file hpcckpt left")
        try:
            return self.create(path)
        except FileExistsError:
            raise CheckpointError(f"{path} was created by someone else while hpcckpt replaced it") from None

    def write_at(self, handle: _Writer, offset: int, buffer) -> None:
        check_position(offset, "offset")
        view = _byte_view(buffer)
        self._write(handle, offset, view)
        if offset + len(view) > handle.position:
            handle.in_place = True

    def truncate(self, handle: _Writer, size: int) -> None:
        check_position(size, "size")
        at = size - handle.base
        if at < 0:
            raise OSError(errno.ENOTSUP, f"s3://{handle.bucket}/{handle.key}: cannot cut bytes already sent")
        buf = handle.buf
        if at > len(buf):
            buf.extend(bytes(at - len(buf)))
            handle.in_place = True
        del buf[at:]
        handle.dirty = True

    def append_from(self, handle: _Writer, source: _Reader, size: int, name: str, pace=None) -> int:
        return copy_through_buffer(self, source, self, handle, size, name, pace, self.part_bytes)

    def read_at(self, handle: _Reader, offset: int, buffer) -> int:
        check_position(offset, "offset")
        view = _byte_view(buffer)
        n = max(0, min(len(view), handle.size - offset))
        if n:
            self._get_into(handle, offset, view[:n])
        return n


def _where(kwargs: dict) -> str:
    return f"s3://{kwargs.get('Bucket', '?')}/{kwargs.get('Key', kwargs.get('Prefix', ''))}"


def _os_error(exc, kwargs: dict) -> OSError:
    """The OSError for a failed request (the S3 error code kept as ``s3_code``)."""
    err = exc.response.get("Error", {})
    code, status = str(err.get("Code", "")), exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    where = _where(kwargs)
    if code in ("404", "NoSuchKey", "NotFound", "NoSuchBucket"):
        out = FileNotFoundError(errno.ENOENT, "No such file or directory" + (" (no such bucket)"
                                                                            if code == "NoSuchBucket" else ""), where)
    elif code in ("PreconditionFailed", "412") and "IfNoneMatch" in kwargs:
        out = FileExistsError(errno.EEXIST, "File exists", where)
    elif code in ("PreconditionFailed", "412"):
        out = OSError(errno.ESTALE, "the object changed while it was read", where)
    elif code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        out = PermissionError(errno.EACCES, f"access denied ({code})", where)
    else:
        out = OSError(errno.EIO, f"{code or status}: {err.get('Message', '')}".strip(), where)
    out.s3_code = code
    return out


_DEFAULT: S3Storage | None = None


def storage_for(path, storage: Storage) -> Storage:
    """The storage a path names: an ``s3://`` path given with the default storage (POSIX) is on S3 (one S3Storage
    per process, configured by boto3's environment and files); anything else keeps ``storage``."""
    from hpcckpt.storage.posix import POSIX

    global _DEFAULT
    if storage is POSIX and is_s3_path(path):
        if _DEFAULT is None:
            _DEFAULT = S3Storage()
        return _DEFAULT
    return storage
