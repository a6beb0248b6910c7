"""Every command on a SQLite path with `#`, `?`, `%`, spaces and non-ASCII reaches that file
and only it; every command that prints stored values prints them as stored (rich markup in
a sweep name, a parameter value or an error is text, never styling and never a crash)."""

from __future__ import annotations

import hashlib

import pytest

from orchestrator.cli import main
from orchestrator.store import repo
from orchestrator.store.engine import open_store_engine
from orchestrator.store.import_jsonl import write_records

MARKUP = ["[bold red]ns5[/bold red]", "[/x]"]
ODD_SWEEP = "[/x][bold]odd[/bold]"
ERROR = "[/x] boom [bold red]red[/bold red]"


def _fill(db: str) -> None:
    recs = [
        {
            "params": {"arm": "mlstm", "seed": s, "task": "mad_recall", "tag.variant": v, "lr": 0.003},
            "trace": [
                {"step": t, "acc": 0.9 if (t >= 400 and s % 2) else 0.01, "loss": 1.0} for t in (1, 200, 400, 600)
            ],
            **({"status": "failed", "error": ERROR} if s == 5 else {}),
        }
        for s in range(6)
        for v in MARKUP
    ]
    write_records(db, "mk", recs, source="t")
    eng, _ = open_store_engine(db)
    with eng.begin() as c:  # a name the CLI would refuse today, as an older database may hold
        repo.upsert_sweep(c, ODD_SWEEP, "# imported from x\n", "h")
    eng.dispose()


@pytest.fixture
def odd_dir(tmp_path):
    d = tmp_path / "we#i?r%d ü"
    d.mkdir()
    return d


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_every_command_on_an_odd_path_and_markup_shown_as_stored(odd_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = str(odd_dir / "a b#c?%20ü.db")
    code, out, err = _run(capsys, "db", "upgrade", "--db", db)
    assert code == 0, err
    _fill(db)
    before = sorted(p.name for p in odd_dir.iterdir())

    code, out, err = _run(capsys, "ls", "--db", db)
    assert code == 0, err
    assert ODD_SWEEP in out and "10/12 completed" in out

    code, out, err = _run(capsys, "status", "--db", db)
    assert code == 0, err
    for text in MARKUP + [ERROR, ODD_SWEEP]:
        assert text in out, text

    code, out, err = _run(capsys, "sql", "SELECT name FROM sweeps ORDER BY name", "--db", db)
    assert code == 0, err
    assert ODD_SWEEP in out
    code, out, err = _run(capsys, "sql", "SELECT DISTINCT error FROM trials WHERE error IS NOT NULL", "--db", db)
    assert code == 0 and ERROR in out, err

    code, out, err = _run(capsys, "analyze", "mk", "outcomes", "--by", "tag.variant", "--db", db)
    assert code == 0, err
    for text in MARKUP:
        assert text in out

    rep = tmp_path / "rep"
    code, out, err = _run(capsys, "report", "mk", "--db", db, "--out", str(rep), "--by", "tag.variant")
    assert code == 0, err
    assert (rep / "index.html").exists() and MARKUP[0] in out

    spec = odd_dir / "s p#e?c ü.yaml"
    spec.write_text(
        "name: t\nfixed: {task: mqar, task.K: 8, arm: armed_gdn, d_model: 16, "
        "n_layers: 1}\nbudget: {steps: 20, eval_every: 10}\n"
    )
    code, out, err = _run(capsys, "submit", str(spec), "--db", db, "--dry-run")
    assert code == 0 and "1 trials" in out, err

    f = odd_dir / "i m#p?ü.jsonl"
    f.write_text('{"params": {"arm": "mlstm", "seed": 99, "task": "mad_recall"}, "trace": [{"step": 1, "acc": 0.5}]}\n')
    code, out, err = _run(capsys, "import", str(f), "--sweep", "mk2", "--db", db)
    assert code == 0, err
    # nothing was created next to the file: no `we` or `a b` stubs of a cut-off path
    after = sorted(p.name for p in odd_dir.iterdir())
    assert set(after) - set(before) <= {spec.name, f.name}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["rep", odd_dir.name])


def test_sql_reads_the_file_it_is_given_not_a_cut_off_path(tmp_path, capsys):
    plain, hashed = tmp_path / "other.db", tmp_path / "other.db#copy"
    for path, name in ((plain, "plain"), (hashed, "hashed")):
        write_records(
            str(path),
            name,
            [{"params": {"arm": "mlstm", "seed": 1, "task": "x"}, "trace": [{"step": 1, "acc": 0.1}]}],
            source="t",
        )
    h = hashlib.sha256(plain.read_bytes()).hexdigest()
    code, out, err = _run(capsys, "sql", "SELECT name FROM sweeps", "--db", str(hashed), "--csv")
    assert code == 0 and out.splitlines() == ["name", "hashed"], err
    # a path whose prefix before `#` does not exist: one line, and no file is created
    missing = tmp_path / "we#ird.db"
    code, out, err = _run(capsys, "sql", "SELECT 1", "--db", str(missing))
    assert code == 2 and "no database" in err
    assert not (tmp_path / "we").exists() and not missing.exists()
    assert hashlib.sha256(plain.read_bytes()).hexdigest() == h


def test_db_folder_that_cannot_be_created_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, out, err = _run(capsys, "db", "upgrade", "--db", str(blocker / "sub" / "o.db"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
