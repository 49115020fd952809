"""HDF5 interop: export checked against plain h5py and h5dump; import of plain h5py files on 1..4 ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")

import hpcckpt  # noqa: E402
from hpcckpt import cli, hdf5  # noqa: E402
from hpcckpt.mpi.collective import SerialComm  # noqa: E402
from hpcckpt.errors import CheckpointError, CorruptCheckpointError, TemplateMismatchError  # noqa: E402
from hpcckpt.format.metadata import FORMAT_VERSION  # noqa: E402
from hpcckpt.storage.metadata_file import read_metadata  # noqa: E402
from hpcckpt.loading.view import CheckpointView  # noqa: E402


from aptget import apt_install  # noqa: E402
from mpitools import run_mpi  # noqa: E402
from testpaths import SCRIPTS  # noqa: E402
from testpaths import TESTS

SCRIPT = os.path.join(SCRIPTS, "hdf5_import.py")
SERIAL = SerialComm()
PARTICLE = np.dtype([("id", "<i8"), ("xyz", "<f8", (3,))])
STRUCT = np.dtype([("a", "<i4"), ("b", "<f8", (2,)), ("c", "u1")])


# --------------------------------------------------------------------------- export

def _checkpoint(path, chunk_bytes=256):
    """A committed checkpoint with many chunks per variable and every kind of value."""
    u = np.arange(40 * 9, dtype=np.float64).reshape(40, 9) * 0.5
    s = np.zeros(17, STRUCT)
    s["a"], s["b"], s["c"] = np.arange(17), np.arange(34).reshape(17, 2) / 3, np.arange(17) * 7
    parts = np.zeros(23, PARTICLE)
    parts["id"], parts["xyz"] = np.arange(23) + 100, np.arange(69).reshape(23, 3) * 0.25
    arrays = {
        "u": u, "s": s, "big_endian": (np.arange(50) - 25).astype(">i4"), "flags": np.arange(30) % 3 == 0,
        "z": (np.arange(12) + 1j * np.arange(12)).astype(np.complex128).reshape(3, 4),
        "empty": np.zeros((0, 4), np.float32), "scalar": np.array(2.5), "fields/v": np.arange(20, dtype=np.int16),
    }
    values = {"step": 7, "dt": 0.125, "title": "run A", "flag": True, "none": None, "nan": float("nan"),
              "cfg": {"a": [1, 2.5, None], "b": {"c": "d"}}, "tup": (1, 2), "arr": np.arange(5, dtype=np.float32),
              "f32": np.float32(1.5), "huge": 2 ** 70, "nul": "a\0b", "zero_d": np.array(3),
              "text": np.array(["x", "yz"])}
    state = {name: hpcckpt.Block(a) for name, a in arrays.items()}
    state["parts"] = hpcckpt.Ragged(parts)
    state.update(values)
    hpcckpt.save(state, path, SERIAL, step=7, chunk_bytes=chunk_bytes)
    return arrays, parts, values


def test_export_round_trip_against_plain_h5py(tmp_path, table_form):
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out.h5")
    arrays, parts, values = _checkpoint(ck)
    seen = []
    result = hdf5.export(ck, out, progress=seen.append)
    assert not os.path.exists(out + ".tmp")
    assert sum(seen) == result.nbytes == hdf5.export_nbytes(ck) == sum(a.nbytes for a in arrays.values()) + parts.nbytes
    assert len(seen) > 20  # chunk by chunk, not one variable at a time
    with h5py.File(out, "r") as f:
        for name, a in arrays.items():
            d = f[name]
            assert d.shape == a.shape and d.dtype == a.dtype, name
            assert np.array_equal(d[()], a), name
            assert d.attrs["hpcckpt.kind"] == "block"
        assert f["s"].dtype.names == ("a", "b", "c") and f["s"].dtype == STRUCT
        assert f["big_endian"].dtype.str == ">i4"
        assert f["parts"].dtype == PARTICLE and f["parts"].attrs["hpcckpt.kind"] == "ragged"
        assert np.array_equal(f["parts"][()], parts)
        assert isinstance(f["fields"], h5py.Group)  # a name with '/' is an HDF5 path
        a = f.attrs
        assert a["hpcckpt.format"] == "hpcckpt" and a["hpcckpt.format_version"] == FORMAT_VERSION and a["hpcckpt.step"] == 7
        assert a["step"] == 7 and a["dt"] == 0.125 and a["title"] == "run A" and a["flag"] == np.True_
        assert np.isnan(a["nan"]) and a["f32"].dtype == np.float32 and a["f32"] == 1.5
        assert np.array_equal(a["arr"], values["arr"]) and a["arr"].dtype == np.float32
        assert json.loads(a["cfg.json"]) == values["cfg"]
        assert json.loads(a["none.json"]) is None and json.loads(a["tup.json"]) == [1, 2]
        assert json.loads(a["huge.json"]) == {"$hpcckpt": "int", "value": str(2 ** 70)}  # beyond int64: tagged text
        assert json.loads(a["nul.json"]) == "a\0b"
        for name in ("cfg", "none", "huge", "nul", "zero_d", "text"):
            assert name not in a and name + ".json" in a


def test_export_then_load_hdf5_round_trip(tmp_path, table_form):
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out.h5")
    arrays, parts, values = _checkpoint(ck)
    hdf5.export(ck, out)
    state = {name: hpcckpt.Block(np.zeros_like(a)) for name, a in arrays.items()}
    state["parts"] = hpcckpt.Ragged()
    state.update({name: None for name in values})
    got = hdf5.load_hdf5(state, out, SERIAL)  # strict: the hpcckpt.* attributes are not values
    for name, a in arrays.items():
        assert np.array_equal(state[name].local, a) and state[name].local.dtype == a.dtype, name
    assert np.array_equal(got["parts"].local, parts)
    for name in ("step", "dt", "title", "flag", "none", "cfg", "huge", "nul"):
        assert got[name] == values[name] and type(got[name]) is type(values[name]), name
    assert np.isnan(got["nan"]) and got["tup"] == [1, 2]
    assert got["f32"] == np.float32(1.5) and got["f32"].dtype == np.float32
    assert np.array_equal(got["arr"], values["arr"]) and got["arr"].dtype == np.float32
    assert got["zero_d"].shape == () and got["zero_d"] == 3
    assert got["text"].tolist() == ["x", "yz"]


def test_a_nested_state_exported_loads_back_with_the_template_that_saved_it(tmp_path):
    """A nested template names the datasets of its path names ("grid/u" is /grid/u), as on a checkpoint."""
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out.h5")
    u, p = np.arange(12.0).reshape(3, 4), np.arange(5, dtype=np.int32)
    saved = {"grid": {"u": hpcckpt.Block(u), "dx": 0.5, "parts": {"p": hpcckpt.Ragged(p)}}, "t": 1.5, "cfg": {"a": 1}}
    hpcckpt.save(saved, ck, SERIAL)
    hdf5.export(ck, out)

    def template():
        return {"grid": {"u": hpcckpt.Block(np.zeros_like(u)), "dx": None, "parts": {"p": hpcckpt.Ragged()}},
                "t": None, "cfg": None}

    from_ck, from_h5 = template(), template()
    got_ck = hpcckpt.load(from_ck, ck, SERIAL)
    got_h5 = hpcckpt.load(from_h5, out, SERIAL)  # raised "variable 'grid' is not in the checkpoint"
    for got, tpl in ((got_ck, from_ck), (got_h5, from_h5)):
        assert set(got) == {"grid", "t", "cfg"} and set(got["grid"]) == {"u", "dx", "parts"}
        assert np.array_equal(tpl["grid"]["u"].local, u) and got["grid"]["u"] is tpl["grid"]["u"]
        assert np.array_equal(got["grid"]["parts"]["p"].local, p)
        assert got["grid"]["dx"] == 0.5 and got["t"] == 1.5 and got["cfg"] == {"a": 1}

    # the checks name the path, and a Stateful template gets load_state_dict, as on a checkpoint
    with pytest.raises(TemplateMismatchError, match="'grid/w' is not in the checkpoint"):
        hpcckpt.load({"grid": {"w": hpcckpt.Block(np.zeros(3))}}, out, SERIAL, strict=False)

    class Model:
        def __init__(self):
            self.u, self.restored = np.zeros_like(u), None

        def state_dict(self):
            return {"grid": {"u": hpcckpt.Block(self.u)}}

        def load_state_dict(self, d):
            self.restored = d

    m = Model()
    hdf5.load_hdf5(m, out, SERIAL, strict=False)
    assert np.array_equal(m.u, u) and set(m.restored["grid"]) == {"u"}


def test_export_reads_bounded_slabs(tmp_path, monkeypatch):
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out.h5")
    big = np.random.default_rng(0).random((512, 256))  # 1 MiB
    hpcckpt.save({"big": hpcckpt.Block(big)}, ck, SERIAL, chunk_bytes=64 << 10)
    sizes = []
    real = CheckpointView.read

    def spy(self, name, region=None):
        arr = real(self, name, region)
        sizes.append(arr.nbytes)
        return arr

    monkeypatch.setattr(CheckpointView, "read", spy)
    hdf5.export(ck, out)
    assert max(sizes) <= 64 << 10 and sum(sizes) == big.nbytes
    with h5py.File(out, "r") as f:
        assert np.array_equal(f["big"][()], big)


def test_export_refuses_existing_file_and_is_atomic(tmp_path):
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out.h5")
    _checkpoint(ck)
    with open(out, "w") as f:
        f.write("precious")
    with pytest.raises(CheckpointError, match="already exists"):
        hdf5.export(ck, out)

    def boom(n):
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        hdf5.export(ck, out, progress=boom, overwrite=True)
    assert open(out).read() == "precious" and not os.path.exists(out + ".tmp")
    with open(out + ".tmp", "w") as f:
        f.write("leftover of an interrupted export")
    hdf5.export(ck, out, overwrite=True)
    assert hdf5.is_hdf5(out) and not os.path.exists(out + ".tmp")
    with pytest.raises(CheckpointError, match="directory"):
        hdf5.export(ck, str(tmp_path), overwrite=True)


def test_export_of_a_missing_checkpoint_is_a_clean_error(tmp_path):
    with pytest.raises(CheckpointError, match="no committed checkpoint"):
        hdf5.export(str(tmp_path / "nothing"), str(tmp_path / "out.h5"))
    assert not os.listdir(tmp_path)


def test_export_of_a_damaged_checkpoint_leaves_no_file(tmp_path):
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out.h5")
    _checkpoint(ck)
    data = os.path.join(ck, "data")
    victim = os.path.join(data, sorted(os.listdir(data))[0])
    with open(victim, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        hdf5.export(ck, out)
    assert not os.path.exists(out) and not os.path.exists(out + ".tmp")


def test_export_refuses_reserved_value_names(tmp_path):
    ck = str(tmp_path / "ck")
    hpcckpt.save({"u": hpcckpt.Block(np.zeros(3)), "hpcckpt.step": 1}, ck, SERIAL)
    with pytest.raises(CheckpointError, match="reserved"):
        hdf5.export(ck, str(tmp_path / "out.h5"))
    ck2 = str(tmp_path / "ck2")
    hpcckpt.save({"a": [1], "a.json": "[2]"}, ck2, SERIAL)
    with pytest.raises(CheckpointError, match="both be the HDF5 attribute"):
        hdf5.export(ck2, str(tmp_path / "out2.h5"))


@pytest.mark.parametrize("name,kind", [("a\0b", "value"), ("", "value"), ("a\0b", "variable"), ("f//u", "variable"),
                                       ("f/./u", "variable"), ("f/u/", "variable"), ("/u", "variable")])
def test_export_refuses_names_hdf5_would_cut_or_rename(tmp_path, name, kind):
    """HDF5 names are C strings and normalised paths: NUL, empty or '.' parts would lose the name."""
    ck = str(tmp_path / "ck")
    state = {"keep": 1, name or "e": hpcckpt.Block(np.arange(3.0)) if kind == "variable" else 2}
    hpcckpt.save(state, ck, SERIAL)
    if not name:  # save refuses an empty name: only crafted metadata holds one
        meta = read_metadata(ck)
        meta.values[""] = meta.values.pop("e")
        with open(os.path.join(ck, "metadata.json"), "wb") as f:
            f.write(meta.to_json_bytes())
    out = str(tmp_path / "out.h5")
    with pytest.raises(CheckpointError, match=kind) as info:
        hdf5.export(ck, out)
    assert repr(name) in str(info.value)
    assert not os.path.exists(out) and not os.path.exists(out + ".tmp")


def test_export_keeps_two_values_that_differ_after_a_nul(tmp_path):
    """Before: 'v\0x' and 'v\0y' were both written as attribute 'v', one silently lost."""
    ck = str(tmp_path / "ck")
    hpcckpt.save({"v\0x": 1, "v\0y": 2}, ck, SERIAL)
    with pytest.raises(CheckpointError, match="NUL"):
        hdf5.export(ck, str(tmp_path / "out.h5"))


def test_h5dump_reads_the_export(tmp_path):
    """HDF5's own command-line reader (Debian's hdf5-tools, installed when missing) reads what export wrote."""
    apt_install(["hdf5-tools"], lambda: [] if shutil.which("h5dump") else ["h5dump"], "the h5dump check")
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out.h5")
    _checkpoint(ck)
    hdf5.export(ck, out)
    whole = subprocess.run(["h5dump", out], capture_output=True, text=True, timeout=60)
    assert whole.returncode == 0, whole.stderr
    assert 'DATASET "u"' in whole.stdout and "H5T_COMPOUND" in whole.stdout and 'ATTRIBUTE "cfg.json"' in whole.stdout
    one = subprocess.run(["h5dump", "-d", "/fields/v", "-w", "0", out], capture_output=True, text=True, timeout=60)
    assert one.returncode == 0, one.stderr
    assert "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19" in one.stdout
    step = subprocess.run(["h5dump", "-a", "/hpcckpt.step", out], capture_output=True, text=True, timeout=60)
    assert step.returncode == 0 and "(0): 7" in step.stdout, step.stdout + step.stderr


# --------------------------------------------------------------------------- import

G0, G1, NREC = 13, 7, 10  # keep in sync with tests/scripts/hdf5_import.py


def write_foreign(path, userblock=0):
    """An input file written by plain h5py, as another code would: no hpcckpt attributes."""
    i, j = np.meshgrid(np.arange(G0), np.arange(G1), indexing="ij")
    recs = np.zeros(NREC, PARTICLE)
    recs["id"], recs["xyz"] = np.arange(NREC), np.arange(NREC)[:, None] * np.ones(3) * 0.5
    with h5py.File(path, "w", userblock_size=userblock) as f:
        f.create_dataset("u", data=i * 1000.0 + j, chunks=(4, 3), compression="gzip")
        f.create_dataset("grp/p", data=(i * 7 + j).astype(np.int32))
        f.create_dataset("even", data=recs)
        f.create_dataset("counted", data=np.arange(NREC, dtype=">i8"))
        f.create_dataset("names", data=["a", "bb"], dtype=h5py.string_dtype())
        f.attrs["dt"] = 0.25
        f.attrs["title"] = np.bytes_(b"initial conditions")  # fixed-length, as C codes write
        f.attrs["config.json"] = json.dumps({"n": [1, 2, 3], "name": "x"})
        f.attrs["unrelated"] = np.arange(3)


def _template(order="C"):
    u = np.zeros((G0, G1), order=order)
    return {"u": hpcckpt.Block(u), "grp/p": hpcckpt.Block(np.zeros((G0, G1), np.int32)), "even": hpcckpt.Ragged(),
            "counted": hpcckpt.Ragged(rows=NREC), "dt": None, "title": None, "config": None}


@pytest.mark.parametrize("order", ["C", "F"])
def test_load_foreign_file_serially(tmp_path, order):
    path = str(tmp_path / "in.h5")
    write_foreign(path, userblock=512 if order == "F" else 0)
    state = _template(order)
    got = hdf5.load_hdf5(state, path, SERIAL, strict=False)
    i, j = np.meshgrid(np.arange(G0), np.arange(G1), indexing="ij")
    assert np.array_equal(state["u"].local, i * 1000.0 + j) and state["u"].local.flags.f_contiguous == (order == "F")
    assert np.array_equal(state["grp/p"].local, i * 7 + j)
    assert got["even"].local.dtype == PARTICLE and np.array_equal(got["even"].local["id"], np.arange(NREC))
    assert got["counted"].local.dtype == np.dtype(">i8") and np.array_equal(got["counted"].local, np.arange(NREC))
    assert got["dt"] == 0.25 and got["title"] == "initial conditions" and got["config"] == {"n": [1, 2, 3], "name": "x"}
    assert got["u"] is state["u"]


def test_load_block_view_into_a_larger_array(tmp_path):
    path = str(tmp_path / "in.h5")
    write_foreign(path)
    halo = np.full((G0 + 2, G1 + 2), -1.0)
    hdf5.load_hdf5({"u": hpcckpt.Block(halo[1:-1, 1:-1])}, path, SERIAL, strict=False)
    i, j = np.meshgrid(np.arange(G0), np.arange(G1), indexing="ij")
    assert np.array_equal(halo[1:-1, 1:-1], i * 1000.0 + j)
    assert (halo[0] == -1).all() and (halo[:, -1] == -1).all()


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_load_foreign_file_under_mpiexec(tmp_path, nranks):
    path = str(tmp_path / "in.h5")
    write_foreign(path)
    proc = run_mpi(nranks, SCRIPT, path, "ok", timeout=120)
    assert all(f"rank {r} ok" in proc.stdout for r in range(nranks)), proc.stdout


@pytest.mark.parametrize("mode,nranks", [("mismatch", 3), ("corrupt", 2)])
def test_errors_reach_every_rank(tmp_path, mode, nranks):
    path = str(tmp_path / "in.h5")
    write_foreign(path)
    if mode == "corrupt":
        _truncate(path)
    proc = run_mpi(nranks, SCRIPT, path, mode, timeout=120)
    assert all(f"rank {r} ok" in proc.stdout for r in range(nranks)), proc.stdout


def _truncate(path):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)


def _load(path, **state):
    return hdf5.load_hdf5(state, path, SERIAL, strict=False)


def test_template_mismatches_name_the_variable(tmp_path):
    path = str(tmp_path / "in.h5")
    write_foreign(path)
    cases = [
        ({"missing": hpcckpt.Block(np.zeros(3))}, "'missing' is not in the checkpoint"),
        ({"u": hpcckpt.Block(np.zeros((G0, G1), np.float32))}, "'u'.*dtype"),
        ({"u": hpcckpt.Block(np.zeros((G0, G1 + 1)))}, "'u'.*global shape"),
        ({"u": hpcckpt.Block(np.zeros((G0, 3)), (0, 0), (G0, G1))}, "'u'.*do not cover the array.*gap at \\[0:"),
        ({"even": hpcckpt.Ragged(np.zeros((1, 2)))}, "'even'.*rows"),
        ({"counted": hpcckpt.Ragged(rows=NREC - 1)}, "'counted'.*ask for 9 rows"),
        ({"u": None}, "'u' is a distributed array"),
        ({"dt": hpcckpt.Block(np.zeros(1))}, "'dt' is a replicated value"),
        ({"names": hpcckpt.Block(np.zeros(2))}, "'names'.*variable-length"),
    ]
    for state, pattern in cases:
        with pytest.raises(TemplateMismatchError, match=pattern):
            _load(path, **state)
    with pytest.raises(TemplateMismatchError, match="does not name"):
        hdf5.load_hdf5({"u": hpcckpt.Block(np.zeros((G0, G1)))}, path, SERIAL)  # strict


def test_corrupt_and_missing_files_are_clean_errors(tmp_path):
    good = str(tmp_path / "good.h5")
    write_foreign(good)
    garbage = str(tmp_path / "garbage.h5")
    with open(garbage, "wb") as f:
        f.write(hdf5.SIGNATURE + os.urandom(4096))
    text = str(tmp_path / "text.h5")
    with open(text, "w") as f:
        f.write("not hdf5 at all\n" * 10)
    truncated = str(tmp_path / "truncated.h5")
    shutil.copy(good, truncated)
    _truncate(truncated)
    for path in (garbage, text, truncated):
        with pytest.raises(CorruptCheckpointError):
            _load(path, u=hpcckpt.Block(np.zeros((G0, G1))))
    with pytest.raises(CheckpointError, match="no such file"):
        _load(str(tmp_path / "absent.h5"), u=hpcckpt.Block(np.zeros((G0, G1))))
    with h5py.File(good, "a") as f:
        f.attrs["bad.json"] = "{not json"
    with pytest.raises(CorruptCheckpointError, match="bad.json"):
        _load(good, bad=None)


def test_is_hdf5(tmp_path):
    plain, shifted = str(tmp_path / "a.h5"), str(tmp_path / "b.h5")
    write_foreign(plain)
    write_foreign(shifted, userblock=1024)
    (tmp_path / "t.txt").write_text("hello")
    assert hdf5.is_hdf5(plain) and hdf5.is_hdf5(shifted)
    assert not hdf5.is_hdf5(str(tmp_path / "t.txt"))
    assert not hdf5.is_hdf5(str(tmp_path)) and not hdf5.is_hdf5(str(tmp_path / "absent"))


@pytest.mark.timeout(20)
def test_is_hdf5_does_not_block_on_a_fifo(tmp_path):
    fifo = str(tmp_path / "in.h5")
    os.mkfifo(fifo)
    assert not hdf5.is_hdf5(fifo)
    with pytest.raises(CheckpointError, match="not a file"):
        _load(fifo, u=hpcckpt.Block(np.zeros(3)))


SECRET = np.arange(16, dtype=np.uint8) + 65  # what a crafted file must not hand over: bytes of another file


def _outside_files(tmp_path) -> str:
    """``tmp_path/outside/secret.bin`` (raw bytes) and ``secret.h5`` (dataset /s); the directory of the input."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.bin").write_bytes(SECRET.tobytes())
    with h5py.File(outside / "secret.h5", "w") as f:
        f["s"] = SECRET
        f.create_group("g")["s"] = SECRET
    inside = tmp_path / "in"
    inside.mkdir()
    return str(inside)


def _crafted(tmp_path, monkeypatch, how: str) -> str:
    """An HDF5 file whose dataset ``x`` (16 uint8) reads its bytes from outside the file in the way ``how``."""
    inside = _outside_files(tmp_path)
    absolute = str(tmp_path / "outside")
    path = os.path.join(inside, "in.h5")
    with h5py.File(path, "w") as f:
        f["plain"] = np.zeros(16, np.uint8)
        if how == "external storage, absolute":
            f.create_dataset("x", (16,), np.uint8, external=[(f"{absolute}/secret.bin", 0, 16)])
        elif how == "external storage, ../":
            f.create_dataset("x", (16,), np.uint8, external=[("../outside/secret.bin", 0, 16)])
        elif how == "external link, absolute":
            f["x"] = h5py.ExternalLink(f"{absolute}/secret.h5", "/s")
        elif how == "external link, ../":
            f["x"] = h5py.ExternalLink("../outside/secret.h5", "/s")
        elif how == "soft link to an external group":
            f["ext"] = h5py.ExternalLink("../outside/secret.h5", "/g")
            f["x"] = h5py.SoftLink("/ext/s")
        elif how == "virtual dataset of another file":
            layout = h5py.VirtualLayout((16,), np.uint8)
            layout[:] = h5py.VirtualSource(f"{absolute}/secret.h5", "s", shape=(16,))
            f.create_virtual_dataset("x", layout)
        elif how == "virtual dataset of an external link":
            f["ext"] = h5py.ExternalLink("../outside/secret.h5", "/s")
            layout = h5py.VirtualLayout((16,), np.uint8)
            layout[:] = h5py.VirtualSource(".", "ext", shape=(16,))
            f.create_virtual_dataset("x", layout)
        else:
            raise AssertionError(how)
    monkeypatch.chdir(inside)  # relative external storage resolves against the working directory
    return path


HOW = ["external storage, absolute", "external storage, ../", "external link, absolute", "external link, ../",
       "soft link to an external group", "virtual dataset of another file", "virtual dataset of an external link"]


@pytest.mark.parametrize("how", HOW)
def test_load_refuses_data_from_outside_the_file(tmp_path, monkeypatch, how):
    path = _crafted(tmp_path, monkeypatch, how)
    out = np.zeros(16, np.uint8)
    with pytest.raises(CheckpointError, match=r"variable 'x'.*(external|virtual).*allow_external=True"):
        hpcckpt.load({"x": hpcckpt.Block(out)}, path, SERIAL, strict=False)
    assert not out.any()
    out = np.zeros(16, np.uint8)  # the trusted-file escape hatch reads what HDF5 resolves
    hdf5.load_hdf5({"x": hpcckpt.Block(out)}, path, SERIAL, strict=False, allow_external=True)
    assert np.array_equal(out, SECRET)


def test_load_follows_links_that_stay_inside_the_file(tmp_path):
    path = str(tmp_path / "in.h5")
    data = np.arange(6.0)
    with h5py.File(path, "w") as f:
        f.create_group("grp")["d"] = data
        f["soft"] = h5py.SoftLink("/grp/d")
        f["alias"] = h5py.SoftLink("grp")  # a soft link as a group on the way
        f["loop"] = h5py.SoftLink("/loop2")
        f["loop2"] = h5py.SoftLink("loop")
        layout = h5py.VirtualLayout((6,), data.dtype)
        layout[:] = h5py.VirtualSource(".", "soft", shape=(6,))
        f.create_virtual_dataset("virtual", layout)
    for name in ("soft", "alias/d", "virtual"):
        out = np.zeros(6)
        _load(path, **{name: hpcckpt.Block(out)})
        assert np.array_equal(out, data), name
    with pytest.raises(TemplateMismatchError, match="'loop'.*more than 16 soft links"):
        _load(path, loop=hpcckpt.Block(np.zeros(6)))


def test_a_ragged_dataset_too_large_to_allocate_is_a_clean_error(tmp_path):
    path = str(tmp_path / "in.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("r", shape=(10**17,), dtype=np.float64, chunks=(1024,))  # nothing stored, all fill value
    with pytest.raises(CheckpointError, match=r"'r': cannot allocate 800000000000000000 bytes"):
        _load(path, r=hpcckpt.Ragged())


def test_api_load_dispatches_hdf5_files(tmp_path):
    path = str(tmp_path / "in.h5")
    write_foreign(path)
    state = {"u": hpcckpt.Block(np.zeros((G0, G1)))}
    hpcckpt.load(state, path, SERIAL, strict=False)
    assert state["u"].local[3, 4] == 3004.0
    text = tmp_path / "x.h5"
    text.write_text("no")
    with pytest.raises(CorruptCheckpointError, match="not an HDF5 file"):
        hpcckpt.load(state, str(text), SERIAL)


def test_export_command_with_progress_bar(tmp_path, capsys):
    import argparse

    ck, out = str(tmp_path / "ck"), str(tmp_path / "out.h5")
    arrays, parts, _ = _checkpoint(ck)
    parser = argparse.ArgumentParser()
    cli.add_export_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["export", ck, out, "--progress"])
    assert args.func(args) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(f"OK: {ck} -> {out}: 9 datasets, 14 attributes")
    assert "export:" in captured.err and "B/s" in captured.err  # the tqdm bar
    with h5py.File(out, "r") as f:
        assert np.array_equal(f["u"][()], arrays["u"])
    args = parser.parse_args(["export", ck, out, "--no-progress"])
    with pytest.raises(CheckpointError, match="already exists"):
        args.func(args)
    assert capsys.readouterr().err == ""


def test_cli_main_export(tmp_path, capsys):
    from hpcckpt.cli import main
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out.h5")
    _checkpoint(ck)
    assert main(["export", ck, out]) == 0
    assert hdf5.is_hdf5(out) and capsys.readouterr().out.startswith("OK:")
    assert main(["export", ck, out]) == 1
    assert "already exists" in capsys.readouterr().err


@pytest.mark.parametrize("version", [1, 2])
def test_export_of_an_old_version_names_its_format_version(tmp_path, version):
    src = os.path.join(TESTS, "data", f"v{version}", "plain")
    out = str(tmp_path / "old.h5")
    hdf5.export(src, out)
    with h5py.File(out, "r") as f, hpcckpt.open(src) as view:
        assert f.attrs["hpcckpt.format_version"] == version
        assert np.array_equal(f["u"][()], view.read("u")) and f["parts"][()].tobytes() == view.read("parts").tobytes()
