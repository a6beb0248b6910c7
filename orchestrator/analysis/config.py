"""The analysis options, as the analysis package's modules import them; the model itself is
:mod:`orchestrator.analysis_config` (outside this package, so the CLI builds its options
without loading the statistics)."""

from orchestrator.analysis_config import (
    ALL_STATUSES,
    DEFAULT_STATUSES,
    AnalysisConfig,
    HeatmapConfig,
    ScalingConfig,
    parse_config,
)

__all__ = ["ALL_STATUSES", "DEFAULT_STATUSES", "AnalysisConfig", "HeatmapConfig", "ScalingConfig", "parse_config"]
