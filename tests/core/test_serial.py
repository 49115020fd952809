"""Single-process save / load / open / Checkpointer (comm=None, no mpiexec): exact data, damage, mismatches."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.lib.recfunctions import repack_fields

import hpcckpt
from hpcckpt import Block, CheckpointError, CorruptCheckpointError, Ragged, TemplateMismatchError
from hpcckpt.root.catalog import gc, list_versions
from metadata_tools import rewrite_metadata, sealed
from testpaths import REPO

STRUCT = np.dtype([("id", "<i8"), ("pos", ">f4", (3,)), ("tag", "S3"), ("ok", "?")])
PADDED = np.dtype({"names": ["x", "y"], "formats": ["<i2", "<f8"], "offsets": [0, 8], "itemsize": 24})
DTYPES = ["i1", "u1", "<i2", ">u2", "<i4", ">i4", "<i8", "<u8", "<f2", "<f4", ">f4", "<f8", ">f8", "<c8", ">c16",
          "?", "<M8[ns]", ">M8[D]", "<m8[us]", "|S7", "<U3", "|V5", STRUCT, PADDED]


def random_array(shape, dtype, seed=0):
    """Random bytes viewed as ``dtype`` (so every bit pattern, NaNs included, must round trip)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) if shape else 1
    raw = np.random.default_rng(seed).integers(0, 256, size=n * dtype.itemsize, dtype=np.uint8)
    if dtype == np.bool_:
        raw &= 1
    return raw.view(dtype).reshape(shape)


def bits(a):
    """The data bytes of an array in C order (padding of structured dtypes is not data)."""
    a = np.ascontiguousarray(a)
    if a.dtype.names is not None:
        a = repack_fields(a)
    return a.tobytes()


def assert_exact(got, expected):
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert bits(got) == bits(expected)


def corrupt_file(path, how):
    if how == "truncate":
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(size // 2)
    elif how == "bitflip":
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x10]))
    elif how == "delete":
        os.remove(path)
    else:
        raise ValueError(how)


def version_dirs(root):
    """The version directories under a Checkpointer root (other files there belong to other features)."""
    return sorted(n for n in os.listdir(root) if n.startswith("step-"))


def data_files(path):
    d = os.path.join(path, "data")
    return sorted(os.path.join(d, f) for f in os.listdir(d))


# ---------------------------------------------------------------- exact round trips


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtypes_round_trip(tmp_path, dtype):
    a = random_array((5, 7), dtype, seed=3)
    res = hpcckpt.save({"a": Block(a), "step": 4}, tmp_path / "ck", chunk_bytes=24)
    assert res.bytes_written == a.nbytes
    assert res.nchunks > 1 and set(res.timings) >= {"write", "commit"}
    out = np.zeros_like(a)
    state = hpcckpt.load({"a": Block(out), "step": None}, tmp_path / "ck")
    assert_exact(out, a)
    assert state["step"] == 4 and state["a"].local is out
    with hpcckpt.open(tmp_path / "ck") as view:
        assert view.variables["a"].shape == (5, 7) and view.variables["a"].dtype == a.dtype
        assert_exact(view.read("a"), a)
        assert view.values == {"step": 4}


SRC_VIEWS = {"C": lambda b: b, "F": np.asfortranarray, "strided": lambda b: b[:, ::2],
             "transposed": lambda b: b.transpose(2, 0, 1), "negative": lambda b: b[::-1, :, ::-2]}
#: target views into a bigger array, with the shape of the matching source view
TARGET_VIEWS = {"C": lambda x: x[:6, :10, :4], "transposed": lambda x: x[:6, :10, :4].transpose(2, 0, 1),
                "negative": lambda x: x[5::-1, :10, 6::-4]}


@pytest.mark.parametrize("chunk_bytes", [1, 7, 64, 1000, 1 << 24])
@pytest.mark.parametrize("layout", sorted(SRC_VIEWS))
def test_layouts_round_trip(tmp_path, layout, chunk_bytes):
    base = random_array((6, 10, 4), "<f8", seed=1)
    src = SRC_VIEWS[layout](base)
    expected = np.ascontiguousarray(src)
    hpcckpt.save({"a": Block(src)}, tmp_path / "ck", chunk_bytes=chunk_bytes)
    assert_exact(hpcckpt.open(tmp_path / "ck").read("a"), expected)
    # load into a view of a bigger array: exactly the view's elements change
    big = np.full((12, 20, 8), -1.0)
    ids = np.arange(big.size).reshape(big.shape)
    if layout == "strided":
        target, covered = big[:6, 0:20:4, :4], ids[:6, 0:20:4, :4]
    elif layout == "F":
        target = np.asfortranarray(np.zeros(src.shape))
        covered = None
    else:
        target, covered = TARGET_VIEWS[layout](big), TARGET_VIEWS[layout](ids)
    assert target.shape == src.shape
    hpcckpt.load({"a": Block(target)}, tmp_path / "ck")
    assert_exact(target, expected)
    if covered is not None:
        untouched = np.ones(big.size, bool)
        untouched[covered.ravel()] = False
        assert np.all(big.ravel()[untouched] == -1.0)


def test_empty_and_zero_d(tmp_path):
    state = {"empty": Block(np.zeros((0, 5), np.int32)), "zero_rows": Block(np.zeros((3, 0)), (0, 0), (3, 0)),
             "scalar": Block(np.array(2.5)), "scalar_struct": Block(random_array((), STRUCT, 2))}
    hpcckpt.save(state, tmp_path / "ck", chunk_bytes=1)
    out = {"empty": Block(np.ones((0, 5), np.int32)), "zero_rows": Block(np.ones((3, 0))),
           "scalar": Block(np.array(0.0)), "scalar_struct": Block(np.zeros((), STRUCT))}
    hpcckpt.load(out, tmp_path / "ck")
    assert out["scalar"].local[()] == 2.5
    assert_exact(out["scalar_struct"].local, state["scalar_struct"].local)
    view = hpcckpt.open(tmp_path / "ck")
    assert view.variables["empty"].shape == (0, 5)
    assert view.read("empty").shape == (0, 5)
    assert view.read("scalar")[()] == 2.5 and view.read("scalar").shape == ()


def test_replicated_values_round_trip(tmp_path):
    values = {"step": 12, "time": 0.125, "name": "run-a", "done": False, "none": None, "nan": float("nan"),
              "inf": -float("inf"), "nested": {"a": [1, 2.5, {"b": None}], "c": "x"}, "f32": np.float32(1.25),
              "i64": np.int64(-7), "f64nan": np.float64("nan"), "small": np.arange(6, dtype=">i2").reshape(2, 3)}
    hpcckpt.save({**values, "u": Block(np.arange(3.0))}, tmp_path / "ck")
    got = hpcckpt.load({**{k: None for k in values}, "u": Block(np.zeros(3))}, tmp_path / "ck")
    for k in ("step", "time", "name", "done", "none", "nested"):
        assert got[k] == values[k] and type(got[k]) is type(values[k])
    assert np.isnan(got["nan"]) and got["inf"] == -float("inf")
    assert type(got["f32"]) is np.float32 and got["f32"] == np.float32(1.25)
    assert type(got["i64"]) is np.int64 and got["i64"] == -7
    assert type(got["f64nan"]) is np.float64 and np.isnan(got["f64nan"])
    assert got["small"].dtype == np.dtype(">i2") and np.array_equal(got["small"], values["small"])
    assert hpcckpt.open(tmp_path / "ck").values["time"] == 0.125


def test_ragged_serial(tmp_path):
    rows = random_array((9, 2), STRUCT, 5)
    hpcckpt.save({"p": Ragged(rows), "q": Ragged(np.zeros((0, 3)))}, tmp_path / "ck", chunk_bytes=50)
    got = hpcckpt.load({"p": Ragged(), "q": Ragged()}, tmp_path / "ck")
    assert_exact(got["p"].local, rows)
    assert got["q"].local.shape == (0, 3)
    got = hpcckpt.load({"p": Ragged(rows=9), "q": Ragged(rows=0)}, tmp_path / "ck")
    assert_exact(got["p"].local, rows)
    with pytest.raises(TemplateMismatchError, match="'p'.*8 rows"):
        hpcckpt.load({"p": Ragged(rows=8), "q": Ragged()}, tmp_path / "ck")
    with pytest.raises(TemplateMismatchError, match="'p'"):
        hpcckpt.load({"p": Ragged(np.zeros((1, 2))), "q": Ragged()}, tmp_path / "ck")


# ---------------------------------------------------------------- open().read of arbitrary regions

SHAPE = (7, 9, 5)


@pytest.fixture(scope="module")
def saved_3d(tmp_path_factory):
    path = tmp_path_factory.mktemp("regions") / "ck"
    a = random_array(SHAPE, "<i4", seed=9)
    hpcckpt.save({"a": Block(a)}, path, chunk_bytes=44)  # chunks of 2 rows of the last axis, crossing rows
    view = hpcckpt.open(path)
    yield a, view
    view.close()


@st.composite
def regions(draw):
    out = []
    for n in SHAPE[: draw(st.integers(0, 3))]:
        kind = draw(st.sampled_from(["slice", "int", "pair", "none"]))
        if kind == "slice":
            out.append(slice(draw(st.one_of(st.none(), st.integers(-n - 2, n + 2))),
                             draw(st.one_of(st.none(), st.integers(-n - 2, n + 2)))))
        elif kind == "int":
            out.append(draw(st.integers(-n, n - 1)))
        elif kind == "pair":
            a = draw(st.integers(0, n))
            out.append((a, draw(st.integers(a, n))))
        else:
            out.append(slice(None))
    return tuple(out)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(regions())
def test_open_read_regions(saved_3d, region):
    a, view = saved_3d
    numpy_index = tuple(slice(*r) if isinstance(r, tuple) else r for r in region)
    assert_exact(view.read("a", region), a[numpy_index])


def test_open_read_errors(saved_3d):
    _, view = saved_3d
    for bad in [(slice(0, 5, 2),), (7,), (-8,), ((3, 2),), ((0, 10),), (0, 0, 0, 0), ("x",)]:
        with pytest.raises(CheckpointError):
            view.read("a", bad)
    with pytest.raises(CheckpointError, match="'nope'"):
        view.read("nope")


# ---------------------------------------------------------------- Checkpointer


def state_for(step, shape=(6, 4)):
    return {"u": Block(np.arange(np.prod(shape), dtype=np.float64).reshape(shape) + 1000 * step), "step": step}


def template(shape=(6, 4)):
    return {"u": Block(np.zeros(shape)), "step": None}


def test_checkpointer_versions_and_retention(tmp_path):
    ck = hpcckpt.Checkpointer(tmp_path / "root", keep=2, chunk_bytes=40)
    assert ck.latest() is None
    with pytest.raises(CheckpointError):
        ck.restore(template())
    for step in (0, 5, 10, 15):
        ck.save(state_for(step), step=step)
        assert ck.latest() == step
    assert ck.steps() == [10, 15]
    committed = [e.name for e in list_versions(str(tmp_path / "root")) if e.committed]  # at once: no wait
    assert committed == ["step-000000000010", "step-000000000015"]
    out = template()
    got = ck.restore(out)
    assert got["step"] == 15 and np.array_equal(out["u"].local, state_for(15)["u"].local)
    got = ck.restore(out, step=10)
    assert got["step"] == 10 and np.array_equal(out["u"].local, state_for(10)["u"].local)
    with pytest.raises(CheckpointError):
        ck.restore(out, step=5)
    ck.close()  # waits for retention's deletions: the retired directories are gone
    assert version_dirs(tmp_path / "root") == ["step-000000000010", "step-000000000015"]
    with pytest.raises(CheckpointError):
        ck.save(state_for(20), step=20)


def test_checkpointer_resave_same_step_uses_revision(tmp_path):
    ck = hpcckpt.Checkpointer(tmp_path / "root", keep=3)
    ck.save(state_for(1), step=1)
    ck.save(state_for(2), step=2)
    ck.save(state_for(7), step=2)  # e.g. after a restart: same step number, different data
    names = version_dirs(tmp_path / "root")
    assert names[0] == "step-000000000001" and names[-1] == "step-000000000002.r1"
    assert ck.steps() == [1, 2] and ck.latest() == 2
    out = template()
    assert ck.restore(out)["step"] == 7
    assert np.array_equal(out["u"].local, state_for(7)["u"].local)
    assert ck.last_restored.endswith("step-000000000002.r1")
    ck.save(state_for(8), step=2)
    assert ck.restore(out)["step"] == 8 and ck.last_restored.endswith(".r2")
    ck.close()
    hpcckpt.root.catalog.gc(str(tmp_path / "root"))
    assert version_dirs(tmp_path / "root") == ["step-000000000001", "step-000000000002.r2"]


def _make_partial(root, step, real=True):
    """A leftover of an interrupted save: data written, metadata never committed."""
    path = os.path.join(root, f"step-{step:012d}")
    if real:
        hpcckpt.save(state_for(step), path, step=step)
        os.remove(os.path.join(path, "metadata.json"))
        open(os.path.join(path, "metadata.json.tmp-123"), "wb").write(b'{"format": "hpcckpt"')
    else:
        os.makedirs(os.path.join(path, "data"))
    return path


def test_leftovers_invisible_and_cleaned(tmp_path):
    root = str(tmp_path / "root")
    ck = hpcckpt.Checkpointer(root, keep=5)
    ck.save(state_for(1), step=1)
    partial = _make_partial(root, 9)
    _make_partial(root, 11, real=False)
    foreign = os.path.join(root, "notes.txt")
    open(foreign, "w").write("mine")
    assert ck.latest() == 1 and ck.steps() == [1]
    out = template()
    assert ck.restore(out)["step"] == 1
    ck.save(state_for(2), step=2)  # the next save cleans leftovers
    ck.close()  # waits for retention's thread, which deletes them
    assert not os.path.exists(partial)
    assert version_dirs(root) == ["step-000000000001", "step-000000000002"]
    _make_partial(root, 3)
    assert [e.committed for e in list_versions(root)] == [True, True, False]
    removed = gc(root)
    assert removed == ["step-000000000003"]
    assert version_dirs(root) == ["step-000000000001", "step-000000000002"]
    assert gc(root, keep=1) == ["step-000000000001"]
    assert open(foreign).read() == "mine"


@pytest.mark.parametrize("how", ["truncate", "bitflip", "delete", "metadata"])
def test_restore_falls_back_to_previous_valid_version(tmp_path, how):
    root = str(tmp_path / "root")
    ck = hpcckpt.Checkpointer(root, keep=3, chunk_bytes=64)
    for step in (1, 2, 3):
        ck.save(state_for(step), step=step)
    newest = os.path.join(root, "step-000000000003")
    if how == "metadata":
        damaged = os.path.join(newest, "metadata.json")
        raw = open(damaged, "rb").read()
        open(damaged, "wb").write(raw[: len(raw) // 2])
    else:
        damaged = data_files(newest)[0]
        corrupt_file(damaged, how)
    out = template()
    with pytest.warns(UserWarning) as record:
        got = ck.restore(out)
    assert got["step"] == 2
    assert np.array_equal(out["u"].local, state_for(2)["u"].local)
    assert ck.last_restored == os.path.join(root, "step-000000000002")
    text = " ".join(str(w.message) for w in record)
    assert damaged in text or os.path.basename(damaged) in text
    # an explicitly requested damaged step is an error, not a silent fallback
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(CheckpointError):
            ck.restore(template(), step=3)
    # every version damaged: a CheckpointError, not a crash
    for step in (1, 2):
        corrupt_file(data_files(os.path.join(root, f"step-{step:012d}"))[0], "bitflip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(CheckpointError, match="every version is damaged"):
            ck.restore(template())


@pytest.mark.parametrize("case", ["unknown", "missing", "dtype", "shape", "readonly", "ndim", "kind", "tiling"])
def test_restore_mismatch_names_variable(tmp_path, case):
    ck = hpcckpt.Checkpointer(tmp_path / "root")
    ck.save({"u": Block(np.zeros((6, 4))), "w": Block(np.zeros(3, np.int32)), "step": 1}, step=1)
    tpl = {"u": Block(np.zeros((6, 4))), "w": Block(np.zeros(3, np.int32)), "step": None}
    name = {"unknown": "extra", "missing": "w"}.get(case, "u")
    if case == "unknown":
        tpl["extra"] = Block(np.zeros(2))
    elif case == "missing":
        del tpl["w"]
    elif case == "dtype":
        tpl["u"] = Block(np.zeros((6, 4), np.float32))
    elif case == "shape":
        tpl["u"] = Block(np.zeros((6, 4)), (0, 0), (7, 4))
    elif case == "readonly":
        ro = np.zeros((6, 4))
        ro.flags.writeable = False
        tpl["u"] = Block(ro)
    elif case == "ndim":
        tpl["u"] = Block(np.zeros(24))
    elif case == "kind":
        tpl["u"] = Ragged()
        # a Ragged template of a block variable reads rows; the mismatch is "u" being a replicated value instead:
        tpl["u"] = None
    elif case == "tiling":
        tpl["u"] = Block(np.zeros((3, 4)), (0, 0), (6, 4))
    with pytest.raises(TemplateMismatchError, match=repr(name)):
        ck.restore(tpl)
    with pytest.raises(TemplateMismatchError, match=repr(name)):
        hpcckpt.load(tpl, os.path.join(tmp_path, "root", "step-000000000001"))


@pytest.mark.parametrize("how", ["truncate", "bitflip", "delete"])
def test_load_and_open_detect_damaged_data(tmp_path, how):
    a = random_array((8, 8), "<f8", 4)
    path = str(tmp_path / "ck")
    hpcckpt.save({"a": Block(a)}, path, chunk_bytes=128)
    damaged = data_files(path)[0]
    corrupt_file(damaged, how)
    with pytest.raises(CorruptCheckpointError, match=os.path.basename(damaged)):
        hpcckpt.load({"a": Block(np.zeros((8, 8)))}, path)
    with pytest.raises(CorruptCheckpointError, match=os.path.basename(damaged)):
        hpcckpt.open(path).read("a")
    problems = hpcckpt.open(path).verify()
    assert problems and all(os.path.basename(damaged) in p for p in problems)




@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "traversal", "absolute", "dtype-object",
                                    "chunk-outside", "format-version", "nan", "overlapping-chunks"])
def test_malformed_metadata_rejected_by_load_and_open(tmp_path, damage):
    path = str(tmp_path / "ck")
    hpcckpt.save({"a": Block(np.arange(16.0).reshape(4, 4)), "t": 1.0}, path, chunk_bytes=32)
    raw_doc = json.loads(open(os.path.join(path, "metadata.json"), "rb").read())

    def mutate(doc):
        if damage == "truncated":
            return json.dumps(doc).encode()[:100]
        if damage == "garbage":
            return b"\x00\x01garbage"
        if damage == "empty":
            return b""
        if damage == "traversal":
            doc["files"][0] = "../../../../../../../etc/passwd"
        elif damage == "absolute":
            doc["files"][0] = "/etc/passwd"
        elif damage == "dtype-object":
            doc["variables"]["a"]["dtype"] = "|O"
        elif damage == "chunk-outside":
            doc["variables"]["a"]["chunks"]["start"][0] = 3
        elif damage == "format-version":
            doc["format_version"] = 999
        elif damage == "nan":
            raw = json.dumps(doc, separators=(",", ":")).encode()
            assert b'"t":1.0' in raw
            return sealed(raw.replace(b'"t":1.0', b'"t":NaN'))
        elif damage == "overlapping-chunks":  # same element count, but chunk 1 now repeats chunk 0's rows
            doc["variables"]["a"]["chunks"]["start"][2:4] = doc["variables"]["a"]["chunks"]["start"][0:2]
        return doc

    assert raw_doc["variables"]["a"]["chunks"]["start"][:4] == [0, 0, 1, 0]
    rewrite_metadata(path, mutate)
    with pytest.raises(CorruptCheckpointError):
        hpcckpt.load({"a": Block(np.zeros((4, 4))), "t": None}, path)
    with pytest.raises(CorruptCheckpointError):
        hpcckpt.open(path).read("a")


def test_symlinked_data_file_outside_is_rejected(tmp_path):
    path = str(tmp_path / "ck")
    hpcckpt.save({"a": Block(np.arange(4.0))}, path)
    victim = data_files(path)[0]
    outside = tmp_path / "outside.bin"
    os.replace(victim, outside)
    os.symlink(outside, victim)
    with pytest.raises(CorruptCheckpointError, match="outside"):
        hpcckpt.load({"a": Block(np.zeros(4))}, path)


def test_save_refuses_foreign_directory(tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "thesis.tex").write_text("precious")
    with pytest.raises(CheckpointError, match="not hpcckpt's"):
        hpcckpt.save({"a": Block(np.arange(3.0))}, target)
    with pytest.raises(CheckpointError, match="not hpcckpt's"):
        hpcckpt.save({"a": Block(np.arange(3.0))}, target, overwrite=True)
    assert (target / "thesis.tex").read_text() == "precious" and sorted(os.listdir(target)) == ["thesis.tex"]
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(CheckpointError):
        hpcckpt.save({"a": Block(np.arange(3.0))}, afile)
    assert afile.read_text() == "x"


def test_save_overwrite_rules(tmp_path):
    path = tmp_path / "ck"
    hpcckpt.save({"a": Block(np.arange(3.0))}, path)
    with pytest.raises(CheckpointError, match="overwrite=True"):
        hpcckpt.save({"a": Block(np.arange(3.0) + 1)}, path)
    assert np.array_equal(hpcckpt.open(path).read("a"), np.arange(3.0))
    hpcckpt.save({"a": Block(np.arange(3.0) + 1)}, path, overwrite=True)
    assert np.array_equal(hpcckpt.open(path).read("a"), np.arange(3.0) + 1)


def test_bad_state_is_template_error_and_leaves_nothing(tmp_path):
    path = tmp_path / "ck"
    for bad in [{"a": Block(np.zeros(3, object))}, {1: 2}, {"a": Block(np.zeros(3), (2,), (4,))}, {"a": object()},
                {"a": Ragged()}, []]:
        with pytest.raises(CheckpointError):
            hpcckpt.save(bad, path)
        assert not os.path.exists(path) or not os.path.exists(os.path.join(path, "metadata.json"))
    with pytest.raises(CheckpointError, match="unknown save option"):
        hpcckpt.save({"a": Block(np.zeros(3))}, path, chunk_size=4)


def test_comm_none_without_mpi_env(tmp_path):
    """comm=None in a plain process with HPCCKPT_NO_MPI (and without it) needs no mpiexec."""
    import subprocess
    import sys
    code = ("import numpy as np, hpcckpt, sys; p=sys.argv[1];"
            "hpcckpt.save({'a': hpcckpt.Block(np.arange(5.0)), 's': 3}, p);"
            "o=np.zeros(5); r=hpcckpt.load({'a': hpcckpt.Block(o), 's': None}, p);"
            "assert r['s']==3 and o.tolist()==[0,1,2,3,4]; print('ok')")
    root = REPO
    for i, extra in enumerate([{"HPCCKPT_NO_MPI": "1"}, {}]):
        env = dict(os.environ, PYTHONPATH=root, **extra)
        proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / f"ck{i}")], capture_output=True, text=True,
                              env=env, timeout=60)
        assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
