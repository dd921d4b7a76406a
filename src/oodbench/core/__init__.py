"""The data model at the bottom of oodbench: outputs, the feature store, the run directory, metrics and numerics.

Everything above (detectors, zero-shot scores, extraction, evaluation, analysis, report, runner, commands) builds on
these modules; they import nothing of oodbench but `oodbench.util`.
"""
