"""Task suite: registry and validation, shapes and masks, determinism, answers by brute-force
decoding, eval/train stream disjointness, layouts of the gap tasks, sampling primitives."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from scipy import stats

import tasks
from tasks.published import PUBLISHED
from tasks.s5 import elements, multiplication_table
from tasks.sampling import _first_distinct, _iid_without_repeats, sample_distinct
from tasks.seeding import STREAM_TAGS, make_generator, stream_seed

IGNORE = -100


def small(name: str) -> tasks.Task:
    """Every registered task at its class's small setting, so brute-force decoding stays fast."""
    return tasks.build(name, **tasks.REGISTRY[name].small, eval_size=300)


# Supervised positions per training row of the built-in tasks at their small settings.
ANSWERS_PER_ROW = {
    "mqar": 8,
    "haystack": 2,
    "collision": 1,
    "s5": 6,
    "mad_recall": 96,
    "ar_scaling": 1,
    "mqar_scaling": 12,
}


def test_registry_names_and_params():
    assert tasks.NAMES == tuple(tasks.REGISTRY) and {name for name, _ in PUBLISHED} <= set(tasks.NAMES)
    for name in tasks.NAMES:
        p = tasks.params(name)
        assert p["eval_size"] == 1024
        task = tasks.build(name)
        assert task.params() == p  # defaults resolve to themselves
    assert tasks.params("mqar")["K"] == 16
    assert tasks.params("haystack")["gate_threshold"] == 0.6


@pytest.mark.parametrize(
    "name,params,message",
    [
        ("mqr", {}, f"unknown task 'mqr' (known: {', '.join(tasks.NAMES)})"),
        ("mqar", {"KK": 3}, "unknown parameter 'KK' for task 'mqar' (known: K, n_keys, n_values, eval_size)"),
        ("mqar", {"K": -3}, "parameter 'K' for task 'mqar' expects int >= 1, got -3"),
        ("mqar", {"K": 8.0}, "parameter 'K' for task 'mqar' expects int >= 1, got 8.0"),
        ("mqar", {"K": 65}, "parameter 'K' for task 'mqar' expects int <= n_keys (64), got 65"),
        (
            "haystack",
            {"curriculum": "rmp"},
            "parameter 'curriculum' for task 'haystack' expects one of 'none', 'uniform', 'ramp', 'gated', got 'rmp'",
        ),
        (
            "haystack",
            {"gap": 3, "curriculum": "ramp"},
            "parameter 'gap' for task 'haystack' expects None when curriculum is 'ramp', got 3",
        ),
        (
            "haystack",
            {"L": 64, "gap": 28},
            "parameter 'gap' for task 'haystack' expects int <= max gap 27 (pairs), got 28",
        ),
        ("collision", {"n_distractor_keys": 4}, "unknown parameter 'n_distractor_keys'"),
        ("s5", {"score": "last"}, "parameter 'score' for task 's5' expects one of 'final', 'all', got 'last'"),
        ("mad_recall", {"seq_len": 101}, "parameter 'seq_len' for task 'mad_recall' expects an even int"),
        (
            "mqar_scaling",
            {"n_facts": 64, "seq_len": 200},
            "parameter 'seq_len' for task 'mqar_scaling' expects int >= 256",
        ),
    ],
)
def test_validation_messages(name, params, message):
    with pytest.raises(ValueError) as exc:
        tasks.validate(name, params)
    assert str(exc.value).startswith(message)
    assert "\n" not in str(exc.value)
    with pytest.raises(ValueError):
        tasks.build(name, **params)


@pytest.mark.parametrize("name", tasks.NAMES)
def test_train_batch_shapes_masks_and_answers(name):
    task = small(name)
    gen = tasks.train_generator(3)
    x, y = task.train_batch(40, gen)
    assert x.dtype == y.dtype == torch.int64
    assert x.shape == y.shape == (40, task.seq_len)
    assert x.device == gen.device
    assert int(x.min()) >= 0 and int(x.max()) < task.vocab_size
    sup = y != IGNORE
    assert int(y[sup].min()) >= 0 and int(y[sup].max()) < task.vocab_size
    if name in ANSWERS_PER_ROW:
        assert (sup.sum(1) == ANSWERS_PER_ROW[name]).all()
    for b in range(x.shape[0]):
        seq = x[b].tolist()
        if name == "mad_recall":
            # Next-token on every position; the final one is the recall.
            assert y[b, :-1].tolist() == seq[1:]
            assert task.decode(seq) == {task.seq_len - 1: int(y[b, -1])}
        elif name == "s5":
            assert _s5_train_targets(seq, task.mask_token) == {
                t: int(v) for t, v in enumerate(y[b].tolist()) if v != IGNORE
            }
        else:
            assert task.decode(seq) == {t: int(v) for t, v in enumerate(y[b].tolist()) if v != IGNORE}


def _s5_train_targets(seq, mask):
    """Every slot's running product, folded with tuple permutations (independent of the table)."""
    els = elements()
    prod, out = tuple(range(5)), {}
    for t, tok in enumerate(seq):
        if tok == mask:
            out[t] = els.index(prod)
        else:
            prod = tuple(prod[els[tok][i]] for i in range(5))
    return out


@pytest.mark.parametrize("name", tasks.NAMES)
def test_eval_batches_sizes_determinism_and_answers(name):
    task = small(name)
    a = task.eval_batches(7)
    b = task.eval_batches(7)
    c = task.eval_batches(8)
    assert [x.shape[0] for x, _ in a] == [256, 44]
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(a[0][0], c[0][0])
    for x, y in a[:1]:
        for row in range(0, x.shape[0], 3):
            seq = x[row].tolist()
            scored = {t: int(v) for t, v in enumerate(y[row].tolist()) if v != IGNORE}
            assert scored and task.decode(seq) == scored
    if name == "mad_recall":  # scored on the final recall only
        assert ((a[0][1] != IGNORE).sum(1) == 1).all() and (a[0][1][:, -1] != IGNORE).all()


def test_s5_final_scoring_and_eval_device_argument():
    task = tasks.build("s5", depth=4, eval_size=10)
    ((x, y),) = task.eval_batches(0, device="cpu")
    assert ((y != IGNORE).sum(1) == 1).all() and (y[:, -1] != IGNORE).all()
    assert x.device.type == "cpu"


@pytest.mark.parametrize("name", tasks.NAMES)
def test_train_stream_determinism(name):
    task = small(name)
    g1, g2, g3 = tasks.train_generator(5), tasks.train_generator(5), tasks.train_generator(6)
    for _ in range(3):
        x1, y1 = task.train_batch(16, g1)
        x2, y2 = task.train_batch(16, g2)
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(task.train_batch(16, g3)[0], x1)


def test_stream_seeds_are_disjoint():
    tags = {stream_seed(s, seed) >> 62 for s in STREAM_TAGS for seed in range(50)}
    assert tags == set(STREAM_TAGS.values())
    train = {stream_seed("train", s) for s in range(-500, 500)}
    evals = {stream_seed("eval", s) for s in range(-500, 500)}
    rebind = {stream_seed("rebind", s) for s in range(-500, 500)}
    assert len(train) == len(evals) == len(rebind) == 1000
    assert not (train & evals) and not (train & rebind) and not (evals & rebind)


@pytest.mark.parametrize(
    "name,params",
    [
        ("mqar", {"K": 4, "eval_size": 512}),
        ("s5", {"depth": 4, "eval_size": 512}),
        ("collision", {"L": 24, "eval_size": 512}),
    ],
)
def test_no_eval_sequence_in_training_stream(name, params):
    """100K training sequences from several data seeds share no row with the eval set. The same
    check on a stream that replays the eval generator finds every row, so it can fail."""
    task = tasks.build(name, **params)
    evals = {tuple(r) for x, _ in task.eval_batches(0) for r in x.tolist()}
    assert len(evals) > 400
    seen = 0
    for data_seed in (0, 1, 2, 3):
        gen = tasks.train_generator(data_seed)
        for _ in range(25):
            x, _ = task.train_batch(256, gen)
            rows = {tuple(r) for r in x.tolist()}
            assert not rows & evals
            seen += len(rows)
    assert seen > 25_000
    replay = make_generator("eval", 0)
    x, _ = task.train_batch(256, replay)
    assert {tuple(r) for r in x.tolist()} <= evals


def test_tasks_without_curriculum_reject_a_state():
    task = tasks.build("mqar", K=4)
    with pytest.raises(ValueError, match="has no curriculum"):
        task.train_batch(2, tasks.train_generator(0), {"cap": 3})


# ---- gap tasks ----------------------------------------------------------------------------------
def _leading_pads(x, pad):
    return (x == pad).int().cumprod(dim=1).sum(dim=1)


def test_haystack_layout_gap_and_tokens():
    task = tasks.build("haystack", L=64, dense=1)
    gen = tasks.train_generator(0)
    assert task.max_gap == 27
    x, y = task.train_batch(64, gen)
    assert (_leading_pads(x, task.pad_token) == 0).all()  # fixed layout: maximum gap
    table_keys = x[:, 0:8:2]
    assert (table_keys < 32).all()
    gap_keys = x[:, 8:62:2]
    assert ((gap_keys >= 32) & (gap_keys < 64)).all()  # lexically distinct distractors
    assert (x[:, -1] == task.mask_token).all()
    assert ((y != IGNORE).nonzero()[:, 1] == 63).all()
    fixed = tasks.build("haystack", L=64, gap=5)
    xf, _ = fixed.train_batch(8, gen)
    assert (_leading_pads(xf, fixed.pad_token) == 64 - 8 - 10 - 2).all()
    ((xe, _),) = fixed.eval_batches(0)[:1]
    assert (_leading_pads(xe, fixed.pad_token) == 0).all()  # eval always at the maximum gap
    odd = tasks.build("haystack", L=65, eval_size=4)
    ((xo, _),) = odd.eval_batches(0)
    assert (_leading_pads(xo, odd.pad_token) == 1).all()


def test_collision_decoys_reuse_table_keys_and_answer_is_first_binding():
    task = tasks.build("collision", L=64)
    x, y = task.train_batch(64, tasks.train_generator(1))
    for b in range(64):
        seq = x[b].tolist()
        table = dict(zip(seq[0:8:2], seq[1:8:2]))
        decoys = seq[8:62:2]
        assert set(decoys) <= set(table)
        q = seq[62]
        assert int(y[b, 63]) == table[q]
    # Decoys rebind the queried key with fresh values: the last binding usually differs.
    last = [dict(zip(r[0:62:2], r[1:62:2]))[r[62]] for r in x.tolist()]
    assert sum(int(a) != b for a, b in zip(y[:, 63], last)) > 40


def test_gap_follows_curriculum_cap():
    task = tasks.build("collision", L=64, curriculum="uniform")
    gen = tasks.train_generator(0)
    gaps = set()
    for _ in range(300):
        x, y = task.train_batch(4, gen, {"cap": 6})
        pads = _leading_pads(x, task.pad_token)
        assert (pads == pads[0]).all()  # one gap per batch
        gap = (64 - 8 - 2 - int(pads[0])) // 2
        gaps.add(gap)
        for b in range(4):
            assert task.decode(x[b].tolist()) == {63: int(y[b, 63])}
    assert gaps == set(range(7))
    with pytest.raises(ValueError, match="outside"):
        task.train_batch(4, gen, {"cap": task.max_gap + 1})


# ---- MAD ----------------------------------------------------------------------------------------
def test_mad_structure():
    task = tasks.build("mad_recall", vocab_size=80, seq_len=512)
    assert (task.n_keys, task.n_values, task.noise_offset, task.probe_token) == (31, 32, 63, 79)
    x, _ = task.train_batch(128, tasks.train_generator(0))
    slots = x[:, :510].reshape(128, 255, 2)
    noise = slots[:, :, 0] >= task.noise_offset
    assert ((slots[:, :, 1] >= task.noise_offset) == noise).all()  # pairs are all-noise or k/v
    assert abs(float(noise.float().mean()) - 0.8 * 254 / 255) < 0.01
    assert (x[:, -2] == task.probe_token).all()
    for b in range(128):
        seq = x[b].tolist()
        assert seq[-1] in seq[:-2:2]  # the probe key was seen


# ---- S5 -----------------------------------------------------------------------------------------
def test_s5_multiplication_table_is_the_group():
    mul = multiplication_table().view(120, 120)
    els = elements()
    ident = els.index(tuple(range(5)))
    assert (mul[ident] == torch.arange(120)).all() and (mul[:, ident] == torch.arange(120)).all()
    for row in mul:  # Latin square: every row a permutation
        assert sorted(row.tolist()) == list(range(120))
    gen = torch.Generator().manual_seed(0)
    a, b, c = (torch.randint(0, 120, (500,), generator=gen) for _ in range(3))
    assert (mul[mul[a, b], c] == mul[a, mul[b, c]]).all()
    for i, j in [(5, 77), (119, 3)]:
        assert els[int(mul[i, j])] == tuple(els[i][els[j][k]] for k in range(5))


# ---- scaling-law AR/MQAR ------------------------------------------------------------------------
def test_scaling_tasks_at_50k_vocab_and_4k_context():
    ar = tasks.build("ar_scaling", vocab_size=50000, n_facts=64, seq_len=4096, eval_size=8)
    mq = tasks.build("mqar_scaling", vocab_size=50000, n_facts=1024, seq_len=4096, eval_size=8)
    gen = tasks.train_generator(0)
    for task in (ar, mq):
        x, y = task.train_batch(4, gen)
        assert x.shape == (4, 4096) and task.vocab_size == 50000
        keys = x[:, 0 : 2 * task.Nf : 2]
        assert (keys >= 1).all() and (keys < 25000).all()
        assert all(len(set(r)) == task.Nf for r in keys.tolist())
        assert (x[:, 1 : 2 * task.Nf : 2] >= 25000).all()
        for b in range(4):
            assert task.decode(x[b].tolist()) == {t: int(v) for t, v in enumerate(y[b].tolist()) if v != IGNORE}
    assert ((y != IGNORE).sum(1) == 1024).all()


# ---- sampling primitives -------------------------------------------------------------------------
def _chi2_uniform_p(rows):
    counts = {}
    for r in rows:
        counts[tuple(r)] = counts.get(tuple(r), 0) + 1
    expect = math.perm(6, 3)
    observed = [counts.get(t, 0) for t in itertools.permutations(range(6), 3)]
    assert sum(observed) == len(rows) and len(counts) == expect
    return stats.chisquare(observed).pvalue


@pytest.mark.parametrize("method", ["rejection", "first_distinct", "topk"])
def test_sample_distinct_is_a_uniform_ordered_subset(method):
    gen = torch.Generator().manual_seed(11)
    n, k, rows = 6, 3, 24_000
    if method == "rejection":
        vals, ok = _iid_without_repeats(rows, n, k, gen)
        vals = vals[ok]
    elif method == "first_distinct":
        vals, ok = _first_distinct(rows, n, k, 5, gen)
        vals = vals[ok]
    else:
        vals = sample_distinct(rows, n, k, gen)  # k*k > n and few draws suffice -> top-k path
    assert all(len(set(r)) == k for r in vals.tolist())
    assert _chi2_uniform_p(vals.tolist()) > 1e-4


# One case per path: small n (top-k), rejection, first-distinct (twice), large-k top-k, edges.
@pytest.mark.parametrize("n,k", [(64, 8), (25000, 64), (5000, 100), (24999, 1024), (3000, 2000), (10, 10), (7, 0)])
def test_sample_distinct_paths(n, k):
    x = sample_distinct(300, n, k, torch.Generator().manual_seed(0))
    assert x.shape == (300, k)
    assert all(len(set(r)) == k and all(0 <= v < n for v in r) for r in x.tolist())
