"""Statistics straight off the result database.

The project's own code is event extraction (:mod:`.events`), person-period expansion
(:mod:`.person_period`) and presentation (:mod:`.report`, :mod:`.figures`); the statistics
come from scipy.stats, lifelines and statsmodels. Start with :func:`load_sweep`
(``trials, evals = load_sweep(db, sweep)``) and the functions of :mod:`.pipeline` (mirrors
of ``orchestrator analyze``).
"""

from .pipeline import (
    KINDS,
    Prepared,
    config,
    fisher,
    fit,
    hazard,
    km,
    lockin,
    logrank,
    mcnemar,
    outcomes,
    permutation,
    prepare,
    run,
)
from .config import AnalysisConfig, HeatmapConfig, parse_config
from .data import SweepData, load_sweep
from .diverged import analysed_evals
from .events import trace_events, trial_events, with_events
from .hazard import HazardResult, fit_hazard
from .person_period import expand, expand_reference, person_period
from .report import Report, build_report, write_report
from .results import TestResult

__all__ = [
    "KINDS",
    "AnalysisConfig",
    "HazardResult",
    "HeatmapConfig",
    "Prepared",
    "SweepData",
    "TestResult",
    "analysed_evals",
    "config",
    "expand",
    "expand_reference",
    "fisher",
    "fit",
    "fit_hazard",
    "hazard",
    "km",
    "load_sweep",
    "lockin",
    "logrank",
    "mcnemar",
    "outcomes",
    "parse_config",
    "permutation",
    "person_period",
    "prepare",
    "Report",
    "build_report",
    "run",
    "trace_events",
    "trial_events",
    "with_events",
    "write_report",
]
