"""One options model: the options of ``orchestrator analyze`` and ``orchestrator report`` are
the fields of ``AnalysisConfig`` under the same names as the keywords of
``orchestrator.analyze`` / ``orchestrator.report``, each option's help is its field's
description, every option reaches the config, the old spellings still work, and the CLI and
the Python API give the same results."""

from __future__ import annotations

import inspect
import json
import warnings

import pytest
import typer.main

import orchestrator
from orchestrator.analysis_config import AnalysisConfig, HeatmapConfig
from orchestrator.cli import app, main
from orchestrator.cli.analysis_options import OLD_FLAGS
from orchestrator.errors import UserError
import test_analysis_cli
from cli_support import run_cli

FIELDS = set(AnalysisConfig.model_fields)
# How the CLI prints (and a dry run, which from Python is `orchestrator.spec.load`); not an
# input of what runs.
CLI_ONLY = {"analyze": {"json"}, "report": {"json"}, "submit": {"json", "quiet", "dry_run"}, "resume": {"quiet"}}
# What each command takes as an argument (positional), not as an option.
ARGUMENTS = {"analyze": {"sweep", "kind"}, "report": {"sweep"}, "submit": {"spec"}, "resume": {"sweep"}}
ARGUMENTS["export"] = {"sweep"}


def _command(name: str):
    return typer.main.get_command(app).commands[name]


def _options(name: str, hidden: bool = False) -> dict:
    """The command's options by their name with dashes as underscores (``--mid-at`` -> ``mid_at``)."""
    return {
        p.opts[0].removeprefix("--").replace("-", "_"): p
        for p in _command(name).params
        if p.param_type_name == "option" and p.hidden == hidden and p.name != "help"
    }


def _api_names(fn) -> set[str]:
    """The names a Python entry point takes: its own keywords, and the config's fields where
    it takes ``**options``."""
    params = inspect.signature(fn).parameters.values()
    names = {p.name for p in params if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        names |= FIELDS
    return names


@pytest.mark.parametrize("command", ["analyze", "report", "submit", "resume", "export"])
def test_cli_options_are_the_api_names(command):
    cli = set(_options(command)) - CLI_ONLY.get(command, set())
    api = _api_names(getattr(orchestrator, command)) - ARGUMENTS[command]
    assert cli == api, (sorted(cli - api), sorted(api - cli))
    # The arguments too: as many, first (report's SWEEP_OR_SPEC is the API's sweep).
    args = [p.name for p in _command(command).params if p.param_type_name == "argument"]
    positional = [
        p.name
        for p in inspect.signature(getattr(orchestrator, command)).parameters.values()
        if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    ]
    assert len(args) == len(positional) and set(positional) == ARGUMENTS[command]
    if command in ("analyze", "report"):
        assert FIELDS <= cli  # every field has its option, under the field's name


@pytest.mark.parametrize("command", ["analyze", "report", "load", "export", "resume", "submit"])
def test_one_argument_order_and_documented_returns(command):
    fn = getattr(orchestrator, command)
    params = inspect.signature(fn).parameters
    first = next(iter(params))
    assert first == ("spec" if command == "submit" else "sweep")
    assert params["db"].kind is inspect.Parameter.KEYWORD_ONLY
    doc = inspect.getdoc(fn)
    assert "Takes" in doc and "Returns" in doc, command


def test_dir_lists_the_public_api():
    public = [n for n in dir(orchestrator) if not n.startswith("_")]
    assert public == sorted(orchestrator.__all__)
    assert {"submit", "resume", "load", "analyze", "report", "export", "connect"} <= set(public)
    for name in public:
        assert inspect.getdoc(getattr(orchestrator, name)), name


def test_the_old_argument_order_is_refused(url):
    # analyze(db, sweep, kind) and load(db, sweep) went at 0.1 (CHANGELOG.md): the database
    # is db= only, so the old order is a TypeError, not a guess.
    with pytest.raises(TypeError):
        orchestrator.analyze(url, "cli", "lockin", by="variant")
    with pytest.raises(TypeError):
        orchestrator.load(url, "cli")
    assert len(orchestrator.load("cli", db=url).trials) > 0


@pytest.mark.parametrize("command", ["analyze", "report"])
def test_help_is_the_field_description(command):
    opts = _options(command)
    for name, field in AnalysisConfig.model_fields.items():
        assert field.description, f"{name} has no description"
        assert opts[name].help.startswith(field.description), name
    assert opts["lockin"].help.endswith("(default 0.8)")
    assert opts["statuses"].help.endswith("(default completed,diverged)")
    assert opts["where"].help == AnalysisConfig.model_fields["where"].description  # no default to show


@pytest.mark.parametrize("command", ["analyze", "report"])
def test_old_spellings_are_hidden_aliases(command):
    hidden = _options(command, hidden=True)
    assert set(hidden) == set(OLD_FLAGS)
    for old, new in OLD_FLAGS.items():
        assert new in FIELDS and hidden[old].help == "old name of --" + new.replace("_", "-"), old


# The fixture: sweep "cli" (2 variants x 2 learning rates x 6 seeds) in the test's database.
url = test_analysis_cli.url


def _run(capsys, *argv):
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    return out, err


# Every field set to something other than its default, as the CLI spells it and as Python does.
EVERY = {
    "by": ("variant", ["variant"]),
    "strata": ("lr", ["lr"]),
    "where": ("lr > 0", "lr > 0"),
    "statuses": ("completed", ["completed"]),
    "metric": ("best", "best"),
    "lockin": ("0.7", 0.7),
    "mid_at": ("0.1", 0.1),
    "escape_at": ("0.7", 0.7),
    "collapse_below": ("0.01", 0.01),
    "formula": ("np.log(t) + C(variant)", "np.log(t) + C(variant)"),
    "link": ("cloglog", "cloglog"),
    "compare": ("ns5,baseline", ["ns5", "baseline"]),
    "pair_on": ("seed,lr", ["seed", "lr"]),
    "alternative": ("greater", "greater"),
    "n_resamples": ("500", 500),
    "random_seed": ("3", 3),
    "heatmap": ("x=lr,y=seed", {"x": "lr", "y": "seed", "facet": None}),
    "contrasts": (["ns5,baseline", "baseline,ns5"], [["ns5", "baseline"], ["baseline", "ns5"]]),
    "horizon": ("1600", 1600),
    "stopped_as": ("solved", "solved"),
    "scaling": (
        "D=lr,seeds=mean,floor=0.1",
        {"D": "lr", "N": "d_state", "Nf": "n_facts", "V": "vocab_size", "layers": "n_layers", "seeds": "mean"}
        | {"floor": 0.1},
    ),
    "diverged": ("censor", "censor"),
    "adjust": ("bh", "bh"),
    "logrank": ("hypergeometric", "hypergeometric"),
}


def _argv(spelled: dict[str, object]) -> list[str]:
    argv = []
    for name, value in spelled.items():
        for v in value if isinstance(value, list) else [value]:
            argv += ["--" + name.replace("_", "-"), str(v)]
    return argv


def test_every_option_reaches_the_config_and_the_python_api_gives_the_same_report(url, capsys, tmp_path):
    assert set(EVERY) == FIELDS
    out, _ = _run(
        capsys,
        "report",
        "cli",
        "--db",
        url,
        "--json",
        "--out",
        tmp_path / "cli",
        *_argv({k: v[0] for k, v in EVERY.items()}),
    )
    cli = json.loads(out)
    # The config echo keeps its old key for the strata (the output of `report --json` is unchanged).
    expected = {("cells" if k == "strata" else k): v[1] for k, v in EVERY.items()}
    assert cli["config"] == expected
    rep = orchestrator.report("cli", db=url, out=tmp_path / "py", **{k: v[1] for k, v in EVERY.items()})
    py = json.loads(json.dumps(rep.to_dict()))
    for d in (cli, py):
        d.pop("html"), d.pop("figures")
    assert py == cli
    assert rep.text().splitlines()[0] == "sweep cli: 24 trials (completed), where lr > 0, traces cut at step 1600"


def test_old_spellings_give_what_the_new_ones_give(url, capsys):
    base = ("analyze", "cli")
    for old, new, value, kind in [
        ("--groups", "--compare", "ns5,baseline", "fisher"),
        ("--status", "--statuses", "all", "lockin"),
        ("--seed", "--random-seed", "7", "permutation"),
    ]:
        extra = ("--by", "variant", "--n-resamples", "200", "--json")
        got, err = _run(capsys, *base, kind, "--db", url, old, value, *extra)
        assert err == ""  # kept working, silently
        assert got == _run(capsys, *base, kind, "--db", url, new, value, *extra)[0], old
    assert main([*base, "fisher", "--db", url, "--compare", "ns5,baseline", "--groups", "ns5,baseline"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --groups is the old name of --compare: give one of them\n"


def test_python_analyze_is_the_cli_analyze(url, capsys):
    # The stored block's options and the given ones, the horizon included, as the CLI applies them.
    opts = {"by": "variant", "compare": "ns5,baseline", "n_resamples": 300, "random_seed": 5, "horizon": 1200}
    argv = ["--by", "variant", "--compare", "ns5,baseline", "--n-resamples", "300", "--random-seed", "5"]
    out, _ = _run(capsys, "analyze", "cli", "permutation", "--db", url, *argv, "--horizon", "1200", "--json")
    assert orchestrator.analyze("cli", "permutation", db=url, **opts).to_dict() == json.loads(out)
    out, _ = _run(capsys, "analyze", "cli", "lockin", "--db", url, "--by", "variant", "--horizon", "1200", "--json")
    res = orchestrator.analyze("cli", "lockin", db=url, by="variant", horizon=1200)
    assert res.to_dict()["rows"] == json.loads(out)
    uncut = orchestrator.analyze("cli", "lockin", db=url, by="variant")
    assert uncut.to_dict()["rows"] != json.loads(out)  # the horizon changed the answer


def test_unknown_or_old_python_names(url):
    with pytest.raises(UserError, match=r"^options: groups: Extra inputs are not permitted$"):
        orchestrator.analyze("cli", "fisher", db=url, by="variant", groups="ns5,baseline")
    new = orchestrator.analyze("cli", "lockin", db=url, by="variant", strata="lr").to_dict()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = orchestrator.analyze("cli", "lockin", db=url, by="variant", cells="lr").to_dict()
    assert old == new
    [w] = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert str(w.message) == "cells= is deprecated, use strata=" and w.filename == __file__
    with pytest.warns(DeprecationWarning), pytest.raises(UserError, match="cells is the old name of strata"):
        orchestrator.analyze("cli", "lockin", db=url, strata="lr", cells="lr")


def test_block_reads_the_old_key_and_options_parse_mappings():
    assert AnalysisConfig.model_validate({"cells": ["lr"]}).strata == ["lr"]
    assert AnalysisConfig.model_validate({"strata": "lr,seed"}).strata == ["lr", "seed"]
    with pytest.raises(ValueError, match="cells is the old name of strata"):
        AnalysisConfig.model_validate({"cells": ["lr"], "strata": ["lr"]})
    cfg = AnalysisConfig().with_overrides(heatmap="x=lr, y=vocab_size, facet=arm")
    assert cfg.heatmap == HeatmapConfig(x="lr", y="vocab_size", facet="arm")
    with pytest.raises(UserError, match=r"^options: heatmap: Value error, expected key=value pairs"):
        AnalysisConfig().with_overrides(heatmap="vocab_size")
    assert AnalysisConfig().with_overrides(scaling="layers=").scaling.layers is None  # N alone
