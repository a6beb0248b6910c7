"""`orchestrator import` against hostile files (tests/bad_imports/): each refused with exit 2,
one line, nothing written, on SQLite and PostgreSQL; sources that are not regular files
(devices, FIFOs, folders) or are too large are refused before anything is read; it never
writes into a submitted sweep; sweep names follow the spec rule; diverged traces (NaN,
Infinity, 1e400) are stored whole as diverged trials."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import pytest
import sqlalchemy as sa
from pydantic import TypeAdapter, ValidationError

from conftest import query
from orchestrator.analysis.data import load_sweep
from orchestrator.cli import main
from orchestrator.store import repo
from orchestrator.store.engine import open_store_engine
from orchestrator.store.import_jsonl import MAX_IMPORT_BYTES, check_sweep_name, write_records

CORPUS = Path(__file__).parent / "bad_imports"
FILES = sorted(CORPUS.glob("*.jsonl"))
P = {"arm": "mlstm", "seed": 1, "task": "mad_recall"}


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _refused(code, err):
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_corpus_size():
    assert len(FILES) >= 61


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_bad_import_writes_nothing(path, tmp_path, capsys):
    db = tmp_path / "x.db"
    code, out, err = _run(capsys, "import", str(path), "--sweep", "pub", "--db", str(db))
    _refused(code, err)
    assert out == "" and not db.exists()


def test_bad_import_leaves_an_existing_database_byte_identical(tmp_path, capsys):
    db = tmp_path / "x.db"
    engine, _ = open_store_engine(str(db))
    write_records(engine, "pub", [{"params": P, "trace": [{"step": 1, "acc": 0.5}]}])
    engine.dispose()  # checkpoints the WAL into the file

    def digest():
        return [
            hashlib.sha256(p.read_bytes() if p.exists() else b"").hexdigest() for p in (db, db.with_name("x.db-wal"))
        ]

    before = digest()
    for path in FILES:
        code, _, err = _run(capsys, "import", str(path), "--sweep", "pub", "--db", str(db))
        _refused(code, err)
    assert digest() == before


def _counts(engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("sweeps", "trials", "trial_params", "evals")
        }


def test_bad_imports_change_nothing_on_either_backend(db_url, capsys):
    """Every corpus file against an existing imported sweep on both backends (a NUL in a
    string used to reach PostgreSQL, which refused it with an internal error)."""
    engine, _ = open_store_engine(db_url)
    write_records(engine, "pub", [{"params": P, "trace": [{"step": 1, "acc": 0.5}]}])
    before = _counts(engine)
    for path in FILES:
        code, out, err = _run(capsys, "import", str(path), "--sweep", "pub", "--db", db_url)
        _refused(code, err)
        assert out == "" and err.startswith("error: "), (path.name, err)
    assert _counts(engine) == before


def _special_sources(tmp: Path) -> dict[str, Path]:
    """Sources that are not regular files, made at test time: reading one without a check
    either never ends (a FIFO without a writer, /dev/zero, /dev/urandom) or fails late."""
    out = {}
    for name, target in (("zero", "/dev/zero"), ("urandom", "/dev/urandom")):
        out[name] = tmp / f"{name}.jsonl"
        out[name].symlink_to(target)
    out["fifo"] = tmp / "fifo.jsonl"
    os.mkfifo(out["fifo"])
    out["folder"] = tmp / "folder.jsonl"
    out["folder"].mkdir()
    out["folder_link"] = tmp / "folder_link.jsonl"
    out["folder_link"].symlink_to(out["folder"])
    return out


def _limit_memory() -> None:
    # A regression that reads /dev/zero fails with a MemoryError here instead of taking
    # the machine's memory.
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["zero", "urandom", "fifo", "folder", "folder_link"])
def test_sources_that_are_not_regular_files_are_refused_at_once(kind, tmp_path):
    src = _special_sources(tmp_path)[kind]
    db = tmp_path / "x.db"
    cmd = [sys.executable, "-m", "orchestrator.cli", "import", str(src), "--sweep", "pub", "--db", str(db)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, preexec_fn=_limit_memory)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    want = "is a folder" if kind.startswith("folder") else "not a regular file"
    assert r.stderr.startswith(f"error: {src}: {want}"), r.stderr
    assert not db.exists()


@pytest.mark.timeout(30)
def test_special_sources_in_process_and_an_oversized_file(tmp_path, capsys):
    """The same refusals through the in-process CLI (a FIFO would block ``open`` without
    O_NONBLOCK: the timeout turns that regression into a failure), and a sparse file past the
    size limit, refused from its size before a byte is read."""
    db = tmp_path / "x.db"
    sources = _special_sources(tmp_path)
    for kind in ("fifo", "folder", "folder_link"):
        code, _, err = _run(capsys, "import", str(sources[kind]), "--sweep", "pub", "--db", str(db))
        _refused(code, err)
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as fh:
        fh.truncate(MAX_IMPORT_BYTES + 1)
    code, _, err = _run(capsys, "import", str(big), "--sweep", "pub", "--db", str(db))
    _refused(code, err)
    assert f"{MAX_IMPORT_BYTES + 1:,} bytes, above the {MAX_IMPORT_BYTES:,}-byte limit" in err
    assert not db.exists()


def test_a_file_name_that_is_not_utf8_is_imported_under_an_escaped_name(db_url, tmp_path, capsys):
    """The OS hands such a name over with lone surrogates, which the spec text could not hold
    (an internal error before)."""
    name = os.fsdecode(b"traces\xff.jsonl")
    (tmp_path / name).write_text(json.dumps({"params": P, "trace": [{"step": 1, "acc": 0.5}]}) + "\n")
    code, out, err = _run(capsys, "import", str(tmp_path / name), "--sweep", "pub", "--db", db_url)
    assert code == 0, err
    assert "traces\\xff.jsonl into sweep pub" in out
    engine, _ = open_store_engine(db_url)
    with engine.connect() as conn:
        assert (
            conn.execute(sa.text("SELECT spec_text FROM sweeps")).scalar_one() == "# imported from traces\\xff.jsonl\n"
        )


@pytest.mark.slow
def test_bad_import_through_a_real_process(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "import",
            str(CORPUS / "params_nested_5000.jsonl"),
            "--sweep",
            "pub",
            "--db",
            str(tmp_path / "x.db"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.db").exists()


NAMES = ["..", ".", "a/b", "[bold]x", "", " ", "../runs", "x" * 201]
# Fail the rule only by trailing or embedded whitespace and control characters: Python's
# re.match with "$" accepted the first (a name stored with its newline).
NEAR_NAMES = ["pub\n", "pub ", "pub\t", "\npub", "p\nub", "pub\r", "pub\x00", "pub\x7f", "pub\u2028"]


@pytest.mark.parametrize("name", NAMES + NEAR_NAMES)
def test_sweep_names_follow_the_spec_rule(name, tmp_path, capsys):
    f = tmp_path / "ok.jsonl"
    f.write_text(json.dumps({"params": P, "trace": [{"step": 1, "acc": 0.1}]}) + "\n")
    code, _, err = _run(capsys, "import", str(f), "--sweep", name, "--db", str(tmp_path / "x.db"))
    _refused(code, err)
    assert "sweep name" in err and not (tmp_path / "x.db").exists()


def test_the_sweep_name_rule_is_the_spec_rule():
    """Import's rule accepts exactly the names a spec's ``name`` field accepts."""
    from orchestrator.errors import UserError
    from orchestrator.spec import SweepSpec

    spec_name = TypeAdapter(Annotated[(str, *SweepSpec.model_fields["name"].metadata)])
    for name in NAMES + NEAR_NAMES + ["pub", "a.b-c_d", "0x", "x" * 200, "_x", "-x", "é"]:
        try:
            spec_name.validate_python(name)
            spec_ok = True
        except ValidationError:
            spec_ok = False
        try:
            check_sweep_name(name)
            import_ok = True
        except UserError as exc:
            import_ok = False
            assert "\n" not in str(exc)
        assert import_ok == spec_ok, repr(name)


def test_import_cannot_overwrite_a_submitted_trial(db_url, tmp_path, capsys):
    engine, _ = open_store_engine(db_url)
    from orchestrator.keys import trial_key

    with engine.begin() as conn:
        sid = repo.upsert_sweep(conn, "real", "name: real\nfixed: {}\n", "h")
        ids = repo.add_trials(conn, sid, [(trial_key(P), P)])
        repo.upsert_evals(
            conn,
            [
                {
                    "trial_id": ids[trial_key(P)],
                    "step": 10,
                    "acc": 0.04,
                    "loss": 3.0,
                    "train_loss": None,
                    "step_lr": None,
                    "elapsed_s": None,
                    "metrics": None,
                }
            ],
        )
        repo.finish_trial(conn, ids[trial_key(P)], "completed")
    f = tmp_path / "over.jsonl"
    f.write_text(json.dumps({"params": P, "trace": [{"step": 10, "acc": 1.0}]}) + "\n")
    code, _, err = _run(capsys, "import", str(f), "--sweep", "real", "--db", db_url)
    _refused(code, err)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT final_acc FROM trials")).scalar_one() == 0.04
        assert conn.execute(sa.text("SELECT acc FROM evals")).scalars().all() == [0.04]


def test_diverged_traces_are_stored_whole_as_diverged(db_url, tmp_path, capsys):
    lines = [
        # Python's json writes a diverged loss as NaN / Infinity
        json.dumps(
            {
                "params": {**P, "seed": 1},
                "trace": [
                    {"step": 1, "acc": 0.1, "loss": 2.0},
                    {"step": 2, "acc": 0.2, "loss": 1.5},
                    {"step": 3, "acc": 0.0, "loss": float("nan")},
                ],
            }
        ),
        json.dumps(
            {
                "params": {**P, "seed": 2},
                "trace": [{"step": 1, "acc": 0.1, "loss": 2.0}, {"step": 2, "acc": 0.1, "loss": float("inf")}],
            }
        ),
        # a literal that overflows a double is the infinity it is, never NULL
        '{"params": {"arm": "mlstm", "seed": 3, "task": "mad_recall"}, "trace": '
        '[{"step": 1, "acc": 0.3, "loss": 2.0}, {"step": 2, "acc": 0.3, "loss": 1e400}]}',
        json.dumps(
            {
                "params": {**P, "seed": 4},
                "trace": [{"step": 1, "acc": 0.4, "loss": 2.0}, {"step": 2, "acc": None, "loss": -float("inf")}],
            }
        ),
        # a null loss is a loss that was not recorded: still a completed run
        json.dumps(
            {
                "params": {**P, "seed": 5},
                "trace": [{"step": 1, "acc": 0.5, "loss": None}, {"step": 2, "acc": 0.6, "loss": 1.0}],
            }
        ),
    ]
    f = tmp_path / "div.jsonl"
    f.write_text("\n".join(lines) + "\n")
    code, out, err = _run(capsys, "import", str(f), "--sweep", "div", "--db", db_url)
    assert code == 0, err
    assert "4 diverged" in out
    engine, _ = open_store_engine(db_url, auto_create=False)
    rows = query(
        db_url,
        "SELECT t.seed, t.status, t.final_step, t.final_acc, t.final_loss, "
        "(SELECT count(*) FROM evals e WHERE e.trial_id = t.id) FROM trials t ORDER BY t.seed",
    )
    # Every point is kept; a non-finite value is NULL, its point marked (the final figures
    # are the last point's, as stored).
    assert [tuple(r) for r in rows] == [
        (1, "diverged", 3, 0.0, None, 3),
        (2, "diverged", 2, 0.1, None, 2),
        (3, "diverged", 2, 0.3, None, 2),
        (4, "diverged", 2, None, None, 2),
        (5, "completed", 2, 0.6, 1.0, 2),
    ]
    marks = query(
        db_url,
        "SELECT t.seed, e.step, e.acc, e.loss, e.nonfinite FROM evals e JOIN trials t ON t.id = e.trial_id "
        "WHERE e.nonfinite IS NOT NULL OR e.loss IS NULL ORDER BY t.seed, e.step",
    )
    assert [tuple(r) for r in marks] == [
        (1, 3, 0.0, None, "loss=nan"),
        (2, 2, 0.1, None, "loss=inf"),
        (3, 2, 0.3, None, "loss=inf"),
        (4, 2, None, None, "loss=-inf"),  # a null acc is not recorded, not non-finite
        (5, 1, 0.5, None, None),  # a null loss was not recorded: no mark
    ]
    # the analysis reads them as it reads the training loop's diverged trials
    data = load_sweep(engine, "div")
    assert sorted(data.trials["status"]) == ["completed"] + ["diverged"] * 4
    # re-importing the same file into the imported sweep is idempotent
    code, out, _ = _run(capsys, "import", str(f), "--sweep", "div", "--db", db_url)
    assert code == 0 and "0 new" in out
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM evals")).scalar_one() == 11
