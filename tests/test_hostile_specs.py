"""The hostile-spec corpus (tests/bad_specs/): every file is refused by `orchestrator
submit` with exit 2 and one line on stderr, no traceback, and no database file or any other
file written; plus the bounds that accept (merge keys, --max-trials) and the warnings, spec
sources that are not regular files, and database values that would store nothing."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import orchestrator
from orchestrator import spec as specs
from orchestrator.cli import main
from orchestrator.errors import UserError
from orchestrator.sources import read_text_file

CORPUS = Path(__file__).parent / "bad_specs"
FILES = sorted(CORPUS.glob("*.yaml"))

GOOD = """
name: t
fixed: {task: mqar, task.K: 8, arm: armed_gdn, d_model: 16, n_layers: 1}
axes:
  seed: 0..2
budget: {steps: 20, eval_every: 10}
"""


def test_corpus_size():
    assert len(FILES) >= 145


def _refused(code: int, err: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ")


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_bad_spec_is_refused_and_writes_nothing(path, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    if path.stem.endswith("small_node"):
        monkeypatch.setenv("ORCH_NODE_MEMORY_BYTES", str(500 * 10**6))  # the node the file names
    db = tmp_path / "sub" / "o.db"
    code = main(["submit", str(path), "--db", str(db), "-q"])
    out = capsys.readouterr()
    _refused(code, out.err)
    assert out.out == ""
    assert list(tmp_path.iterdir()) == []  # no database, no runs/ folder, nothing


@pytest.mark.slow
@pytest.mark.parametrize("name", ["three_axes_of_1000", "latin1", "nested_list_5000", "seed_2_pow_70"])
def test_bad_spec_through_a_real_process(name, tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "submit", str(CORPUS / f"{name}.yaml"), "--dry-run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_deep_nesting_and_size_generated(tmp_path, capsys):
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: t\nfixed: " + "[" * 50_000 + "]" * 50_000 + "\n")
    big = tmp_path / "big.yaml"
    big.write_text(GOOD + "#" * (2 << 20) + "\n")
    for p in (deep, big):
        code = main(["submit", str(p), "--dry-run"])
        _refused(code, capsys.readouterr().err)


def test_cap_counts_before_materialising_and_max_trials_raises_it(tmp_path, capsys):
    p = tmp_path / "s.yaml"
    p.write_text(GOOD.replace("seed: 0..2", "seed: 0..2\n  eval_seed: 0..3"))
    code = main(["submit", str(p), "--dry-run", "--max-trials", "11"])
    err = capsys.readouterr().err
    _refused(code, err)
    assert "12 combinations" in err and "--max-trials" in err
    code = main(["submit", str(p), "--dry-run", "--max-trials", "12", "--json"])
    out = capsys.readouterr()
    assert code == 0 and '"trials": 12' in out.out


def test_yaml_merge_keys_are_defaults_that_written_keys_override():
    text = GOOD.replace("budget:", "resources:\n  <<: {cpu: 2, gpu: 0}\n  cpu: 1\nbudget:")
    sw = specs.load(text=text)
    assert sw.spec.resources.cpu == 1 and sw.spec.resources.gpu == 0
    with pytest.raises(specs.SpecError, match="duplicate key 'cpu'"):
        specs.load(text=text.replace("  cpu: 1\n", "  cpu: 1\n  cpu: 3\n"))


def test_exclude_matching_nothing_warns(tmp_path, capsys):
    p = tmp_path / "s.yaml"
    p.write_text(GOOD + "exclude: [{seed: 7}]\n")
    code = main(["submit", str(p), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 0 and "exclude[0]" in err and "matches no combination" in err
    assert len(specs.load(p).trials) == 3


def test_password_in_storage_is_redacted_and_warned(tmp_path, capsys):
    text = GOOD + "storage: 'postgresql://orch:hunter2-secret@127.0.0.1:5432/test'\n"
    sw = specs.load(text=text)
    assert "hunter2-secret" not in sw.text and "orch:***@127.0.0.1" in sw.text
    assert sw.spec.storage and "hunter2-secret" in sw.spec.storage  # still usable to connect
    assert any("PGPASSFILE" in w for w in sw.warnings)
    assert specs.load(text=text).hash == sw.hash  # stable: re-submits match


def test_node_memory_bound_is_stated(monkeypatch):
    monkeypatch.setenv("ORCH_NODE_MEMORY_BYTES", str(10**5))
    with pytest.raises(specs.SpecError, match=r"largest node.s 0.0001 GB"):
        specs.load(text=GOOD)
    monkeypatch.delenv("ORCH_NODE_MEMORY_BYTES")
    assert len(specs.load(text=GOOD).trials) == 3


def test_every_checked_in_sweep_still_loads():
    root = Path(__file__).parents[1] / "sweeps"
    for p in sorted(root.glob("*.yaml")):
        assert specs.load(p).trials, p
    assert os.environ.get("ORCH_NODE_MEMORY_BYTES") is None


def test_bad_spec_is_refused_on_the_amend_path_too(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name in ("lr_1e300", "tag_set_axis", "storage_sqlite_memory"):
        code = main(["submit", str(CORPUS / f"{name}.yaml"), "--amend", "--db", str(tmp_path / "o.db"), "-q"])
        _refused(code, capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


# ---- spec sources that are not regular files ---------------------------------------------


def _limit_memory() -> None:
    # 1 GiB of address space: a dry run needs a fraction of it, and a loader that regressed to
    # reading /dev/zero whole dies of MemoryError at once instead of taking the machine's memory.
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def _not_regular(kind: str, tmp_path: Path) -> Path:
    path = tmp_path / "specs" / f"{kind}.yaml"
    path.parent.mkdir()
    if kind in ("zero", "urandom"):
        path.symlink_to(f"/dev/{kind}")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, shown",
    [
        ("zero", "is a character device"),
        ("urandom", "is a character device"),
        ("fifo", "is a FIFO (named pipe)"),
        ("folder", "is a folder"),
        ("socket", "is a socket"),
    ],
)
def test_spec_that_is_not_a_regular_file_is_refused_unread(kind, shown, tmp_path):
    """A symlink to /dev/zero or /dev/urandom, a FIFO, a folder or a socket is refused from its
    stat, never read (a FIFO never even opened): one line, exit 2, quickly. A separate process
    under a memory cap and a timeout, so a regression fails this test instead of the machine."""
    path = _not_regular(kind, tmp_path)
    work = tmp_path / "cwd"
    work.mkdir()
    try:
        r = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "submit", str(path), "--dry-run"],
            capture_output=True,
            text=True,
            cwd=work,
            timeout=60,
            preexec_fn=_limit_memory,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"submit of a {kind} spec did not return within 60 s (it read or opened it)")
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"error: {path}: {shown}, not a regular file (a spec must be a regular file)\n"
    assert r.stdout == "" and list(work.iterdir()) == []


def test_read_is_bounded_whatever_size_the_file_reports(tmp_path):
    """A regular file can report size 0 and hold more (/proc): the read stops at limit + 1."""
    proc = Path("/proc/self/maps")
    if not proc.is_file():
        pytest.skip("no /proc")
    with pytest.raises(
        UserError, match=r"^/proc/self/maps: more than the 64-byte \(6.10352e-05 MiB\) limit of a spec$"
    ):
        read_text_file(proc, limit=64)
    small = tmp_path / "s.yaml"
    small.write_text(GOOD)
    assert read_text_file(small, limit=len(GOOD)) == GOOD
    with pytest.raises(UserError, match=r"above the 10-byte"):
        read_text_file(small, limit=10)


def test_size_limit_is_named_and_checked_before_reading(tmp_path, capsys):
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:  # sparse: 2 GiB on paper, nothing on disk
        f.truncate(2 << 30)
    code = main(["submit", str(big), "--dry-run"])
    err = capsys.readouterr().err
    _refused(code, err)
    assert err == f"error: {big}: 2,147,483,648 bytes, above the 1,048,576-byte (1 MiB) limit of a spec\n"


# ---- YAML: dates stay strings --------------------------------------------------------------


def test_untagged_date_is_a_string():
    """YAML 1.1 would make `2026-01-01` a datetime.date; here it is the string written, so a
    label keeps it as text and a number field refuses it (tests/bad_specs/date_as_seed.yaml)."""
    sw = specs.load(text=GOOD.replace("task.K: 8,", "task.K: 8, tag.when: 2026-01-01, tag.at: 2026-01-01 10:00:00,"))
    params = sw.trials[0][1]
    assert params["tag.when"] == "2026-01-01" and params["tag.at"] == "2026-01-01 10:00:00"
    with pytest.raises(specs.SpecError, match=r"fixed.seed: .*integer.*got '2026-01-01'"):
        specs.load(
            text=GOOD.replace("axes:\n  seed: 0..2", "axes:\n  eval_seed: 0..2").replace(
                "n_layers: 1}", "n_layers: 1, seed: 2026-01-01}"
            )
        )


def test_upper_bounds_accept_what_real_studies_use():
    text = GOOD.replace(
        "n_layers: 1}", "n_layers: 1, lr: 10.0, weight_decay: 0.1, grad_clip: 1.0e+6, threads: 256}"
    ).replace("budget:", "retries: 100\nresources: {cpu: 2}\nbudget:")
    sw = specs.load(text=text)
    assert sw.spec.retries == 100 and sw.trials[0][1]["lr"] == 10.0 and sw.trials[0][1]["threads"] == 256


# ---- database values that would store nothing --------------------------------------------

_MEMORY = "is an in-memory SQLite database, gone when the run ends: give a file path or sqlite:///PATH"
_EMPTY = "is empty: give a file path, sqlite:///PATH or postgresql://HOST/DB"


@pytest.mark.parametrize(
    "db, says",
    [
        ("sqlite://", _MEMORY),
        ("sqlite:///:memory:", _MEMORY),
        ("sqlite+pysqlite://", _MEMORY),
        (":memory:", _MEMORY),
        ("sqlite:///file::memory:?cache=shared", _MEMORY),
        ("", _EMPTY),
        ("  ", _EMPTY),
    ],
)
def test_in_memory_or_empty_db_is_refused_by_every_command(db, says, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ORCH_DB", raising=False)
    spec = tmp_path / "s.yaml"
    spec.write_text(GOOD)
    for argv in (
        ["submit", str(spec), "--dry-run"],
        ["submit", str(spec), "--dry-run", "--json"],
        ["submit", str(spec), "-q"],
        ["submit", str(spec), "-q", "--amend"],
        ["resume", "t", "-q"],
        ["ls"],
        ["status", "t"],
        ["sql", "SELECT 1"],
    ):
        code = main([*argv, "--db", db])
        out = capsys.readouterr()
        _refused(code, out.err)
        assert out.err == f"error: --db {db!r} {says}\n", argv
        assert out.out == ""
    assert [p.name for p in tmp_path.iterdir()] == ["s.yaml"]  # no runs/ folder, no database


def test_orch_db_in_memory_is_refused_and_empty_means_unset(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORCH_DB", "sqlite:///:memory:")
    code = main(["ls"])
    err = capsys.readouterr().err
    _refused(code, err)
    assert err == f"error: $ORCH_DB 'sqlite:///:memory:' {_MEMORY}\n"
    monkeypatch.setenv("ORCH_DB", "")  # `ORCH_DB= orchestrator ls`: the shell's way to unset it
    code = main(["ls"])
    err = capsys.readouterr().err
    _refused(code, err)
    assert "no database at" in err and "runs/orchestrator.db" in err
    assert list(tmp_path.iterdir()) == []


def test_python_api_refuses_the_same(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"^--db 'sqlite://' is an in-memory SQLite database"):
        orchestrator.submit(GOOD, db="sqlite://")
    with pytest.raises(UserError, match=r"^--db '' is empty"):
        orchestrator.resume("t", db="")
    doc = {"name": "t", "fixed": {"task": "mqar", "task.K": 8, "arm": "armed_gdn", "d_model": 16, "n_layers": 1}}
    doc["budget"] = {"steps": 20, "eval_every": 10}
    with pytest.raises(UserError, match=r"^<dict>: storage: empty"):
        orchestrator.submit({**doc, "storage": ""}, db=str(tmp_path / "o.db"))
    with pytest.raises(UserError, match=r"^<dict>: fixed.lr: must be at most 10 .*got 1e\+300$"):
        orchestrator.submit({**doc, "fixed": {**doc["fixed"], "lr": 1e300}}, db=str(tmp_path / "o.db"))
    with pytest.raises(UserError, match=r"^<dict>: line \d+: YAML tag '!!set' is not allowed"):
        orchestrator.submit({**doc, "axes": {"seed": {1, 2}}}, db=str(tmp_path / "o.db"))
    with pytest.raises(UserError, match=r"^<dict>: line \d+: YAML tag '!!binary' is not allowed"):
        orchestrator.submit({**doc, "description": b"bytes"}, db=str(tmp_path / "o.db"))
    assert list(tmp_path.iterdir()) == []


def test_resume_validates_the_stored_spec_the_same_way(tmp_path, capsys):
    """A sweep stored before these bounds (its spec has lr 1e300) is refused at resume, before
    Ray starts or a row changes."""
    from orchestrator.keys import spec_hash
    from orchestrator.store import repo
    from orchestrator.store.engine import open_store_engine

    db = tmp_path / "o.db"
    engine, _ = open_store_engine(str(db))
    text = GOOD.replace("n_layers: 1}", "n_layers: 1, lr: 1.0e+300}")
    repo.ensure_sweep(engine, "t", text, spec_hash(text))
    engine.dispose()
    before = _dump(db)
    code = main(["resume", "t", "--db", str(db), "-q"])
    err = capsys.readouterr().err
    _refused(code, err)
    assert err == "error: <sweep t>: fixed.lr: must be at most 10 (far above any study's learning rate), got 1e+300\n"
    assert _dump(db) == before  # every row as it was (the file's header counters may move)


def _dump(db: Path) -> list[str]:
    import sqlite3

    con = sqlite3.connect(db)
    try:
        return list(con.iterdump())
    finally:
        con.close()


def test_memory_estimate_counts_the_built_model(monkeypatch, capsys):
    # The width estimate said 80,384 parameters for an MLP a million wide at d 32; the built
    # model (on the meta device: nothing allocated) has 65,010,205, and its training memory
    # is refused on a 500 MB node with the real count in the line.
    import cells
    import tasks

    text = (CORPUS / "mlp_hidden_million_small_node.yaml").read_text()
    sweep = specs.load(text=text, node_memory=10**12)
    params = sweep.trials[0][1]
    task = tasks.build("mqar", K=8)
    real = sum(
        p.numel()
        for p in cells.build(
            "gated_deltanet", vocab_size=task.vocab_size, d_model=32, n_layers=1, mlp_hidden=1000000
        ).parameters()
    )
    assert real == 65_010_205
    assert abs(specs.model_params(params) - real) <= 0.1 * real
    assert specs.train_memory_bytes(params) >= real * specs.BYTES_PER_PARAM
    assert specs.gpu_memory_bytes(params) > specs.train_memory_bytes(params)
    with pytest.raises(specs.SpecError, match="65,010,205 parameters") as exc:
        specs.load(text=text, node_memory=500 * 10**6)
    assert "0.5 GB of memory" in str(exc.value)


@pytest.mark.parametrize("cpu, ok", [(1.0e-300, False), (0.005, False), (0.01, True), (0.123456, True)])
def test_cpu_share_bounded_below_and_rounded_as_ray_keeps_it(cpu, ok):
    text = GOOD + f"resources: {{cpu: {cpu}}}\n"
    if not ok:
        with pytest.raises(specs.SpecError, match="resources.cpu"):
            specs.load(text=text)
        return
    assert specs.load(text=text).spec.resources.cpu == round(cpu, 4)
