"""Loading a sweep into pandas: parameter columns and aliases, the status filter, and
``--where`` evaluated safely away from the store."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from orchestrator import analysis as oa
from orchestrator.store.import_jsonl import write_records
from orchestrator.errors import UserError
from orchestrator.store.engine import open_store_engine

GRID = [1, 200, 400, 600]


def _rec(seed, variant, vocab, lr, status="completed", final=0.9):
    return {
        "params": {
            "arm": "mlstm",
            "seed": seed,
            "lr": lr,
            "optim.lr": lr / 10,
            "model.lr": lr * 10,
            "tag.variant": variant,
            "task.vocab_size": vocab,
            "task.seq_len": 768,
            "flags.conv": seed % 2 == 0,
            "model.dims": [32, 64],
        },
        "trace": [{"step": s, "acc": 0.03 if s < 600 else final} for s in GRID],
        "status": status,
    }


@pytest.fixture
def store(db_url):
    engine, _ = open_store_engine(db_url)
    recs = [
        _rec(s, v, vocab, lr)
        for s in range(2)
        for v in ("baseline", "ns5")
        for vocab in (80, 88)
        for lr in (1e-3, 3e-3)
    ]
    recs.append(_rec(9, "ns5", 96, 1e-2, status="failed", final=0.01))
    write_records(engine, "grid", recs)
    write_records(engine, "other", [_rec(0, "baseline", 80, 1e-3)])
    return engine


def test_load_exposes_params_under_full_short_and_formula_names(store):
    trials, evals = oa.load_sweep(store, "grid")
    assert len(trials) == 16 and len(evals) == 16 * len(GRID)
    for col in (
        "trial_id",
        "key",
        "status",
        "tag.variant",
        "variant",
        "tag_variant",
        "task.vocab_size",
        "vocab_size",
        "task_vocab_size",
        "flags.conv",
        "conv",
        "optim.lr",
        "optim_lr",
        "model_lr",
        "lr",
    ):
        assert col in trials.columns, col
    # "lr" is the top-level parameter, never an alias of optim.lr or model.lr.
    assert (trials["lr"] * 10 == trials["model.lr"]).all()
    assert set(trials["variant"]) == {"baseline", "ns5"}
    assert trials["dims"].iloc[0] == "[32, 64]"  # lists become their JSON text
    assert list(evals.columns) == ["trial_id", "step", "acc", "loss", "nonfinite"]
    assert not evals["nonfinite"].any()
    assert evals.groupby("trial_id")["step"].apply(list).map(lambda s: s == GRID).all()


def test_status_filter_and_unknown_sweep(store):
    trials, _ = oa.load_sweep(store, "grid", statuses=["completed", "failed"])
    assert len(trials) == 17 and set(trials["status"]) == {"completed", "failed"}
    with pytest.raises(UserError, match="no sweep named 'nope'.*grid"):
        oa.load_sweep(store, "nope")
    with pytest.raises(UserError, match="status"):
        oa.load_sweep(store, "grid", statuses=["done"])


def test_where_filters_on_any_parameter_name(store):
    def n(cond):
        return len(oa.load_sweep(store, "grid", where=cond).trials)

    assert n("variant = 'ns5'") == 8
    assert n("vocab_size = 88 AND variant = 'ns5'") == 4
    assert n('"task.vocab_size" = 88') == 8
    assert n("task_vocab_size = 80 AND lr > 0.002") == 4
    assert n("conv = 1") == 8
    assert n("status = 'completed' AND seed IN (0)") == 8
    assert n("trial_id IN (SELECT trial_id FROM trials WHERE seed = 1)") == 8
    assert n("variant = 'it''s (not) here' OR (lr < 0.002 AND \"tag.variant\" = 'ns5')") == 4
    trials, evals = oa.load_sweep(store, "grid", where="seed = 1 AND lr = 0.001")
    assert set(evals["trial_id"]) == set(trials["trial_id"]) and len(trials) == 4


BAD_WHERE = [
    ("vocab_sz = 88", "no such column: vocab_sz"),
    ("variant = ", "syntax error|incomplete input"),
    ("1=1; DELETE FROM trials", "no ';'"),
    ("1=1) UNION SELECT 1 --", "unbalanced"),
    ("1=1) UNION SELECT (1", "unbalanced"),
    ("variant = 'ns5' -- x", "comments"),
    ("variant = 'ns5", "unterminated"),
    ("load_extension('x') IS NULL", "not authorized|no such function"),
]


def test_bad_or_hostile_where_is_a_user_error_and_leaves_the_store_alone(store):
    for cond, msg in BAD_WHERE:
        with pytest.raises(UserError) as e:
            oa.load_sweep(store, "grid", where=cond)
        text = str(e.value)
        assert "\n" not in text and text.startswith("--where"), text
        assert any(m in text for m in msg.split("|")), text
    with store.connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM trials")).scalar_one() == 18


def test_missing_database_is_not_created(tmp_path):
    path = tmp_path / "absent.db"
    with pytest.raises(UserError, match="no database"):
        oa.load_sweep(str(path), "grid")
    assert not path.exists()


def test_one_shared_eval_read_loads_every_status_set_and_where_alike(store):
    """``read_evals`` (every status, read in chunks, no ORDER BY) handed to ``load_sweep``
    gives the frames ``load_sweep`` reads for itself: statuses and ``where`` alike."""
    import numpy as np
    import pandas as pd

    from orchestrator.analysis import data

    shared = data.read_evals(store, "grid")
    assert list(shared.columns) == list(data.EVAL_DTYPES) and len(shared) == 17 * len(GRID)
    pairs = shared[["trial_id", "step"]].to_numpy()
    assert (np.lexsort((pairs[:, 1], pairs[:, 0])) == np.arange(len(pairs))).all()
    before = shared.copy()
    for statuses, where in (
        (["completed"], None),
        (["completed", "failed"], None),
        (["failed"], None),
        (["completed"], "variant == 'ns5' and vocab_size == 88"),
    ):
        own = oa.load_sweep(store, "grid", where=where, statuses=statuses)
        got = oa.load_sweep(store, "grid", where=where, statuses=statuses, evals=shared)
        pd.testing.assert_frame_equal(got.trials, own.trials)
        pd.testing.assert_frame_equal(got.evals, own.evals)
        assert len(got.evals) > 0
    pd.testing.assert_frame_equal(shared, before)  # the shared frame is never changed


def test_the_shared_read_may_come_as_a_function_called_once_after_the_trials(store, monkeypatch):
    """``evals=`` a function (the dashboard's read, still under way in child processes): it
    is called once, after the trials are read, and the frames are those of the frame."""
    import pandas as pd

    from orchestrator.analysis import data
    from orchestrator.store import reader

    shared = data.read_evals(store, "grid")
    order: list[str] = []
    real = reader.analysis_rows
    monkeypatch.setattr(reader, "analysis_rows", lambda *a, **k: order.append("trials") or real(*a, **k))
    got = oa.load_sweep(store, "grid", statuses=["completed"], evals=lambda: order.append("evals") or shared)
    assert order == ["trials", "evals"]
    own = oa.load_sweep(store, "grid", statuses=["completed"], evals=shared)
    pd.testing.assert_frame_equal(got.trials, own.trials)
    pd.testing.assert_frame_equal(got.evals, own.evals)


def test_read_evals_in_small_chunks_equals_one_chunk(store, monkeypatch):
    import pandas as pd

    from orchestrator.analysis import data

    whole = data.read_evals(store, "grid")
    monkeypatch.setattr(data, "EVAL_CHUNK", 7)  # 68 rows: ten chunks, the last a short one
    pd.testing.assert_frame_equal(data.read_evals(store, "grid"), whole)


def test_by_trial_and_step_sorts_like_pandas_and_leaves_a_sorted_frame_alone():
    import numpy as np
    import pandas as pd

    from orchestrator.analysis.data import by_trial_and_step

    rng = np.random.default_rng(0)
    n = 5000
    frame = pd.DataFrame(
        {
            "trial_id": rng.integers(1, 50, n),
            "step": rng.integers(0, 10_000, n),
            "acc": rng.random(n),
        }
    ).drop_duplicates(["trial_id", "step"], ignore_index=True)
    got = by_trial_and_step(frame)
    want = frame.sort_values(["trial_id", "step"], kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want)
    assert by_trial_and_step(got) is got
    # equal trial ids with steps going down, and the last pair out of order, are caught
    for ids, steps in (([1, 1, 2], [5, 3, 0]), ([1, 2, 2, 1], [0, 0, 1, 9])):
        f = pd.DataFrame({"trial_id": ids, "step": steps})
        assert by_trial_and_step(f) is not f
        pd.testing.assert_frame_equal(by_trial_and_step(f), f.sort_values(["trial_id", "step"]).reset_index(drop=True))
    one = pd.DataFrame({"trial_id": [3], "step": [1]})
    assert by_trial_and_step(one) is one


def test_param_columns_fast_path_equals_flattening_every_row():
    """``reader.param_columns`` passes flat, scalar-only params through as they are; its
    frame equals the one built by flattening and JSON-encoding every row (the reference),
    for flat, nested, list-valued, empty, None and mixed-type rows in any order."""
    import random

    import pandas as pd

    from orchestrator.params import flatten_params
    from orchestrator.store import reader

    def reference(params, index, skip=()):
        flat = [{k: reader.json_cell(v) for k, v in flatten_params(p or {}).items()} for p in params]
        names = list(dict.fromkeys(k for f in flat for k in f if k not in skip))
        return pd.DataFrame({n: [f.get(n) for f in flat] for n in names}, index=index).infer_objects(), names

    rng = random.Random(3)
    pool = [
        {"lr": 1e-3, "seed": 0, "model.read": "raw", "flag": True},
        {"seed": 1, "lr": 3e-3, "model.read": "ema", "flag": False, "extra": None},
        {"model": {"read": "raw", "dims": [32, 64]}, "seed": 2},
        {"lr": 1, "tags": ["a", "b"], "seed": 3},
        {"opt": {"betas": {"b1": 0.9}}, "seed": 4, "lr": 1e-2},
        {},
        None,
        {"lr": "0.1", "seed": 5.0},
    ]
    # Trials that all have the same parameters (each a column every trial has), of mixed
    # kinds within a column: ints and floats, bools, None, strings, lists.
    same = [
        {"lr": 1e-3, "seed": 0, "flag": True, "extra": None, "tags": ["a"], "name": "x"},
        {"lr": 1, "seed": 1, "flag": False, "extra": None, "tags": [], "name": "y"},
        {"seed": 2, "lr": 2.5, "flag": True, "extra": 3, "tags": ["b", 1], "name": None},
        {"seed": 3, "lr": 7, "flag": 1, "extra": "z", "tags": None, "name": "w"},
    ]
    for trial in range(40):
        source = pool if trial % 2 else same[: 2 + trial % 3]
        params = [rng.choice(source) for _ in range(rng.randint(0, 40))]
        index = pd.RangeIndex(len(params))
        for skip in ((), ("seed",)):
            got, names = reader.param_columns(params, index, skip)
            want, want_names = reference(params, index, skip)
            assert names == want_names
            pd.testing.assert_frame_equal(got, want)


def test_params_decoded_already_prepare_the_same_sweep(store, monkeypatch):
    """The dashboard hands the analysis the params its trial table decoded (flattened):
    the prepared sweep equals the one that decodes the stored params itself, for flat,
    nested and list-valued params, and a trial the mapping lacks is decoded as before."""
    import pandas as pd

    from orchestrator.analysis import pipeline
    from orchestrator.store import reader
    from orchestrator.ui import db as q

    nested = []
    for i in range(6):
        r = _rec(i, "baseline" if i % 2 else "ns5", 80 + 8 * (i % 3), 1e-3 * (1 + i % 2))
        r["params"] = {"model": {"read": ["raw", "ema"][i % 2], "dims": [32, 16 * i]}, "opt": {"lr": r["params"]["lr"]}}
        nested.append(r)
    write_records(store, "nested", nested)
    seen: list[dict] = []
    real = reader.analysis_rows
    for sweep, n in (("grid", 17), ("nested", 6)):
        table = q.trials(store, sweep)
        known = dict(zip(table.columns["trial_id"], table.columns["params"]))
        assert len(known) == n
        if sweep == "nested":
            assert all("model.read" in p for p in known.values())  # flattened, not as stored
        want = pipeline.prepare(store, sweep)
        for mapping in (known, dict(list(known.items())[: n // 2])):
            got = pipeline.prepare(store, sweep, known_params=mapping)
            pd.testing.assert_frame_equal(got.trials, want.trials)
            pd.testing.assert_frame_equal(got.data.trials, want.data.trials)
        # The mapping is what is read: two trials' params swapped make another frame.
        a, b = list(known)[0], list(known)[1]
        swapped = {**known, a: known[b], b: known[a]}
        assert not pipeline.prepare(store, sweep, known_params=swapped).data.trials.equals(want.data.trials)
        # The grid view's preparation takes them from the cached table.
        monkeypatch.setattr(
            reader, "analysis_rows", lambda *a, **k: seen.append(k.get("known_params")) or real(*a, **k)
        )
        prep = q._grid_prepared(store, sweep, None)
        monkeypatch.setattr(reader, "analysis_rows", real)
        assert seen[-1] == known
        pd.testing.assert_frame_equal(prep.trials, want.trials)
