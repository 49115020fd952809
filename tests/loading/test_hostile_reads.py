"""Hostile files on the read side: FIFOs, directories and absurd sizes where a checkpoint's data should be.

Every reader (``hpcckpt.open``, ``load``, ``Checkpointer.restore``, ``verify``,
``hpcckpt verify``/``export``, compaction) must answer a FIFO planted in place
of a data file, or of the target of an incremental reference, with a
CorruptCheckpointError naming the file, never block on it.  Each such test
carries a timeout so that a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import base64
import os
import warnings
import zlib

import numpy as np
import pytest

import hpcckpt
from hpcckpt import cli
from hpcckpt.format import chunk_columns
from hpcckpt.mpi.collective import SerialComm
from hpcckpt.incremental.chain import compact
from hpcckpt.errors import CheckpointError, CorruptCheckpointError
from hpcckpt.storage import POSIX
from hpcckpt.storage.metadata_file import read_metadata
from metadata_tools import read_doc, rewrite_metadata

COMM = SerialComm()
PART = os.path.join("data", "part-000000.bin")


def _state(step: int) -> dict:
    return {"u": hpcckpt.Block(np.arange(40.0).reshape(8, 5) + step), "p": hpcckpt.Ragged(np.arange(6) * step),
            "step": step}


def _template() -> dict:
    return {"u": hpcckpt.Block(np.zeros((8, 5))), "p": hpcckpt.Ragged(), "step": None}


def _plant(path: str, kind: str) -> None:
    """Replace the file ``path`` by a FIFO or a directory of the same name."""
    os.remove(path)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.mkdir(path)


@pytest.fixture
def version(tmp_path):
    path = str(tmp_path / "ck")
    hpcckpt.save(_state(1), path, comm=COMM)
    return path


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["fifo", "dir"])
def test_open_read_and_load_refuse_a_non_regular_data_file(version, kind):
    data = os.path.join(version, PART)
    _plant(data, kind)
    with hpcckpt.open(version) as view:
        with pytest.raises(CorruptCheckpointError, match="not a regular file|is a directory") as info:
            view.read("u")
        assert data in str(info.value)
        problems = view.verify()
    assert problems and all(data in p for p in problems)
    with pytest.raises(CorruptCheckpointError) as info:
        hpcckpt.load(_template(), version, comm=COMM)
    assert data in str(info.value)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["fifo", "dir"])
def test_cli_verify_and_export_name_a_non_regular_data_file(version, kind, tmp_path, capsys):
    data = os.path.join(version, PART)
    _plant(data, kind)
    assert cli.main(["verify", version]) == 1
    out, err = capsys.readouterr()
    assert f"CORRUPT: {data}" in out and "internal error" not in err
    assert cli.main(["export", version, str(tmp_path / "x.h5")]) == 1
    err = capsys.readouterr().err
    assert data in err and "internal error" not in err
    assert not os.path.exists(tmp_path / "x.h5")


@pytest.mark.timeout(20)
def test_restore_skips_a_version_whose_data_file_is_a_fifo(tmp_path):
    root = str(tmp_path / "root")
    ck = hpcckpt.Checkpointer(root, comm=COMM, track_failures=False)
    for step in (1, 2):
        ck.save(_state(step), step=step)
    versions = sorted(d for d in os.listdir(root) if d.startswith("step-"))
    newest = os.path.join(root, versions[-1])
    _plant(os.path.join(newest, PART), "fifo")
    template = _template()
    with pytest.warns(UserWarning, match="not a regular file"):
        out = ck.restore(template)
    ck.close()
    assert ck.last_restored == os.path.join(root, versions[0])
    np.testing.assert_array_equal(template["u"].local, np.arange(40.0).reshape(8, 5) + 1)
    np.testing.assert_array_equal(out["p"].local, np.arange(6))
    assert out["step"] == 1


def _chain(tmp_path) -> tuple[str, str, str]:
    """A root whose second version ``b`` is incremental on the first ``a`` (references its data file)."""
    root = str(tmp_path / "root")
    u = np.random.default_rng(3).random((64, 64))
    ck = hpcckpt.Checkpointer(root, comm=COMM, incremental=True, block_bytes=4096, track_failures=False)
    ck.save({"u": hpcckpt.Block(u)}, step=1)
    u[3] = 0
    ck.save({"u": hpcckpt.Block(u)}, step=2)
    ck.close()
    a, b = (os.path.join(root, d) for d in sorted(d for d in os.listdir(root) if d.startswith("step-")))
    assert any(f.startswith(f"@{os.path.basename(a)}/") for f in read_metadata(b).files)
    return root, a, b


@pytest.mark.timeout(20)
def test_a_fifo_as_the_target_of_an_incremental_reference(tmp_path, capsys):
    root, a, b = _chain(tmp_path)
    target = os.path.join(a, PART)
    _plant(target, "fifo")
    with hpcckpt.open(b) as view:
        with pytest.raises(CorruptCheckpointError, match="FIFO") as info:
            view.read("u")
        assert os.path.realpath(target) in str(info.value)
    with pytest.raises(CorruptCheckpointError, match="FIFO"):
        hpcckpt.load({"u": hpcckpt.Block(np.zeros((64, 64)))}, b, comm=COMM)
    assert cli.main(["verify", b]) == 1
    assert "FIFO" in capsys.readouterr().out


@pytest.mark.timeout(20)
def test_compaction_refuses_a_fifo_it_would_copy(tmp_path):
    root, a, b = _chain(tmp_path)
    target = os.path.join(a, PART)
    _plant(target, "fifo")
    before = open(os.path.join(b, "metadata.json"), "rb").read()
    with pytest.raises(CorruptCheckpointError, match="FIFO") as info:
        compact(root, keep=1)
    assert os.path.realpath(target) in str(info.value)
    assert open(os.path.join(b, "metadata.json"), "rb").read() == before  # nothing rewritten


def test_compaction_of_a_chunk_too_large_to_allocate_is_a_clean_error(tmp_path):
    root, a, b = _chain(tmp_path)
    meta = read_metadata(b)
    var = meta.variables["u"]
    ref = next(i for i, f in enumerate(meta.files) if f.startswith("@"))
    n = 10**17
    var.shape, var.chunks = (n,), type(var.chunks).from_rows([(ref, 0, 8 * n, "0" * 16, (0,), (n,))], 1)
    with open(os.path.join(b, "metadata.json"), "wb") as f:
        f.write(meta.to_json_bytes())
    with pytest.raises(CheckpointError, match=f"variable 'u': cannot allocate {8 * n} bytes"):
        compact(root, keep=1)


def _huge(version: str, elements: int = 10**18) -> None:
    """Rewrite the metadata so that variable ``p`` (uint8, one chunk) claims ``elements`` elements."""
    meta = read_metadata(version)
    var = meta.variables["p"]
    var.dtype = np.dtype(np.uint8)
    var.shape = (elements,)
    var.chunks.count[:] = elements
    var.chunks.nbytes[:] = elements
    with open(os.path.join(version, "metadata.json"), "wb") as f:
        f.write(meta.to_json_bytes())


def test_a_variable_too_large_to_allocate_is_a_clean_error(version, tmp_path, capsys):
    _huge(version)
    with hpcckpt.open(version) as view:
        with pytest.raises(CheckpointError, match=r"variable 'p': cannot allocate 1000000000000000000 bytes"):
            view.read("p")
        with pytest.raises(CorruptCheckpointError, match="truncated: a chunk of 'p'"):  # a region fits in memory
            view.read("p", (slice(0, 4),))
    with pytest.raises(CheckpointError, match=r"'p': cannot allocate 1000000000000000000 bytes"):
        hpcckpt.load(_template(), version, comm=COMM)
    assert cli.main(["export", version, str(tmp_path / "x.h5")]) == 1
    err = capsys.readouterr().err
    assert "'p'" in err and "internal error" not in err


@pytest.mark.parametrize("depth", [600, 900])
def test_a_value_nested_too_deeply_is_corrupt_not_a_recursion_error(version, capsys, depth):
    """JSON that parses can still be too deep for the value decoder: a CorruptCheckpointError naming the value."""
    meta = read_metadata(version)
    deep = 1
    for _ in range(depth):
        deep = {"a": [deep]} if depth % 2 else [deep]
    meta.values["deep"] = deep
    with open(os.path.join(version, "metadata.json"), "wb") as f:
        f.write(meta.to_json_bytes())
    with pytest.raises(CorruptCheckpointError, match="'deep'|metadata.json"):
        hpcckpt.open(version)
    with pytest.raises(CorruptCheckpointError, match="'deep'|metadata.json"):
        hpcckpt.load({**_template(), "deep": None}, version, comm=COMM)
    assert cli.main(["inspect", version]) == 1
    err = capsys.readouterr().err
    assert "internal error" not in err and ("'deep'" in err or "metadata.json" in err)


@pytest.mark.timeout(60)
def test_export_of_an_out_of_range_step_is_a_clean_error(version, tmp_path, capsys):
    meta = read_metadata(version)
    meta.step = 10**30
    with open(os.path.join(version, "metadata.json"), "wb") as f:
        f.write(meta.to_json_bytes())
    pytest.importorskip("h5py")
    from hpcckpt.hdf5 import export

    with pytest.raises(CheckpointError, match="step"):
        export(version, str(tmp_path / "x.h5"))
    assert cli.main(["export", version, str(tmp_path / "x.h5")]) == 1
    err = capsys.readouterr().err
    assert "step" in err and "internal error" not in err
    assert not os.path.exists(tmp_path / "x.h5") and not os.path.exists(tmp_path / "x.h5.tmp")


def four_rows_each(rank: int, size: int, step: int) -> dict:
    """The state of step ``step`` on ``rank`` of ``size``: 4 rows each of a vector, scaled by the step."""
    return {"u": hpcckpt.Block(np.arange(4.0 * rank, 4.0 * rank + 4) * step, offset=(4 * rank,),
                               global_shape=(4 * size,)), "step": step}


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60, method="thread")  # a rank blocked in MPI never sees a signal
def test_mpi_restore_falls_back_from_a_fifo_on_every_rank(mpi_tmp):
    """The newest version's last data file is a FIFO: every rank restores the previous version exactly."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    n = 4 * size

    def state(step):
        return four_rows_each(rank, size, step)

    ck = hpcckpt.Checkpointer(os.path.join(mpi_tmp, "root"), comm=comm, track_failures=False)
    for step in (1, 2):
        ck.save(state(step), step=step)
    newest = comm.bcast(ck.root and sorted(d for d in os.listdir(ck.root) if d.startswith("step-"))[-1])
    if rank == 0:
        data = os.path.join(ck.root, newest, "data")
        _plant(os.path.join(data, sorted(os.listdir(data))[-1]), "fifo")
    comm.Barrier()
    template = {"u": hpcckpt.Block(np.zeros(4), offset=(4 * rank,), global_shape=(n,)), "step": None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = ck.restore(template)
    ck.close()
    assert os.path.basename(ck.last_restored) != newest
    np.testing.assert_array_equal(template["u"].local, np.arange(4.0 * rank, 4.0 * rank + 4))
    assert out["step"] == 1
    assert comm.allgather(ck.last_restored) == [ck.last_restored] * size


@pytest.mark.timeout(20)
def test_partner_copy_refuses_a_fifo_and_completes_its_protocol(tmp_path):
    """L2 partner copies stream data files between ranks: a FIFO source is refused, not read (one rank, to itself)."""
    from mpi4py import MPI

    from hpcckpt.levels.partner import transfer

    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "data").mkdir(parents=True)
    os.mkfifo(src / PART)
    with pytest.raises(CorruptCheckpointError, match="FIFO") as info:
        transfer(POSIX, MPI.COMM_SELF, [(0, 0, PART, 100)], str(src), str(dst))
    assert str(src / PART) in str(info.value)
    assert not os.path.exists(dst / PART) and not os.path.exists(str(dst / PART) + ".part")


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60, method="thread")  # a rank blocked in MPI never sees a signal
def test_mpi_parity_encode_refuses_a_fifo_on_one_rank(mpi_tmp):
    """L3 parity: the rank whose data file is a FIFO fails after the collective rounds; the others finish."""
    from mpi4py import MPI

    from hpcckpt.levels.parity import encode

    comm = MPI.COMM_WORLD.Split(0 if MPI.COMM_WORLD.Get_rank() < 2 else MPI.UNDEFINED, 0)
    if comm == MPI.COMM_NULL:
        return
    rank = comm.Get_rank()
    data = os.path.join(mpi_tmp, f"data-{rank}.bin")
    if rank == 1:
        os.mkfifo(data)
    else:
        with open(data, "wb") as f:
            f.write(b"\1" * 100)
    out = os.path.join(mpi_tmp, f"parity-{rank}.bin")
    if rank == 1:
        with pytest.raises(CorruptCheckpointError, match="FIFO"):
            encode(POSIX, comm, data, 100, [100, 100], out)
    else:
        assert encode(POSIX, comm, data, 100, [100, 100], out) == 100
    comm.Free()


def _damage_columnar_block(version: str, variable: str) -> None:
    """Re-seal ``version``'s metadata with ``variable``'s columnar block failing its body hash (the seal
    intact, so what refuses it is the block's own check)."""
    def edit(doc):
        chunks = doc["variables"][variable]["chunks"]
        block = bytearray(zlib.decompress(base64.b64decode(chunks["data"])))
        block[24] ^= 0x01  # the header's XXH3-64 of the body
        chunks["data"] = base64.b64encode(zlib.compress(bytes(block), 1)).decode()
    rewrite_metadata(version, edit)


@pytest.mark.timeout(60)
def test_every_reader_refuses_a_damaged_columnar_block(tmp_path, capsys, monkeypatch):
    """open, load, hpcckpt verify/export/inspect: one CorruptCheckpointError naming the file and the variable;
    a Checkpointer restore falls back to the previous version."""
    monkeypatch.setattr(chunk_columns, "COLUMNAR_MIN_CHUNKS", 1)
    root = str(tmp_path / "root")
    ck = hpcckpt.Checkpointer(root, comm=COMM, track_failures=False)
    for step in (1, 2):
        ck.save(_state(step), step=step)
    older, newest = (os.path.join(root, d) for d in sorted(d for d in os.listdir(root) if d.startswith("step-")))
    assert "data" in read_doc(newest)["variables"]["u"]["chunks"]
    _damage_columnar_block(newest, "u")
    message = r"metadata\.json: chunks of 'u': the block fails its checksum"
    with pytest.raises(CorruptCheckpointError, match=message):
        hpcckpt.open(newest)
    with pytest.raises(CorruptCheckpointError, match=message):
        hpcckpt.load(_template(), newest, comm=COMM)
    for argv in (["verify", newest], ["inspect", newest], ["export", newest, str(tmp_path / "o.h5")]):
        assert cli.main(argv) != 0
        captured = capsys.readouterr()
        assert "chunks of 'u': the block fails its checksum" in captured.out + captured.err, argv
    template = _template()
    with pytest.warns(UserWarning, match="fails its checksum"):
        out = ck.restore(template)
    ck.close()
    assert ck.last_restored == older and out["step"] == 1
    np.testing.assert_array_equal(template["u"].local, np.arange(40.0).reshape(8, 5) + 1)


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(60, method="thread")  # a rank blocked in MPI never sees a signal
def test_mpi_a_damaged_columnar_block_is_one_error_on_every_rank(mpi_tmp, table_form):
    """A load of a version whose block is damaged raises the same CorruptCheckpointError on every rank; a restore
    falls back to the previous version on every rank, exactly."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    n = 4 * size

    def state(step):
        return four_rows_each(rank, size, step)

    def template():
        return {"u": hpcckpt.Block(np.zeros(4), offset=(4 * rank,), global_shape=(n,)), "step": None}

    ck = hpcckpt.Checkpointer(os.path.join(mpi_tmp, "root"), comm=comm, track_failures=False)
    for step in (1, 2):
        ck.save(state(step), step=step)
    newest = os.path.join(ck.root, sorted(d for d in os.listdir(ck.root) if d.startswith("step-"))[-1])
    if rank == 0:
        if table_form == "columnar":
            _damage_columnar_block(newest, "u")
        else:  # the JSON form: a chunk's offset out of range, re-sealed
            rewrite_metadata(newest, lambda doc: doc["variables"]["u"]["chunks"]["offset"].__setitem__(0, 1 << 62))
    comm.Barrier()
    with pytest.raises(CorruptCheckpointError) as info:
        hpcckpt.load(template(), newest, comm=comm)
    assert "chunks of 'u'" in str(info.value)
    assert comm.allgather(str(info.value)) == [str(info.value)] * size
    got = template()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = ck.restore(got)
    ck.close()
    assert os.path.basename(ck.last_restored) != os.path.basename(newest) and out["step"] == 1
    np.testing.assert_array_equal(got["u"].local, np.arange(4.0 * rank, 4.0 * rank + 4))
