"""One exception type per layer, all derived from `OodbenchError`."""


class OodbenchError(Exception):
    """Base class of every error oodbench raises on purpose."""


class DataError(OodbenchError, ValueError):
    """Invalid arrays: wrong shape, dtype, non-finite values, empty sets."""


class StoreError(OodbenchError):
    """Feature store problems: missing entries, provenance mismatches, corrupt shards."""


class DetectorError(OodbenchError):
    """Detector misuse: unknown name, bad hyper-parameter, missing requirement, not fitted."""


class MetricError(OodbenchError, ValueError):
    """Invalid metric input: empty, non-finite or mis-shaped score arrays."""


class ExtractError(OodbenchError):
    """Feature extraction problems: unknown model, missing weights, unreadable data."""


class ZeroShotError(OodbenchError):
    """Zero-shot scoring and vocabulary problems."""


class AnalysisError(OodbenchError, ValueError):
    """Statistics and report problems."""


class AuditError(OodbenchError):
    """Benchmark audit problems."""


class AnnotateError(OodbenchError):
    """Benchmark construction and annotation problems."""


class ConfigError(OodbenchError, ValueError):
    """Invalid experiment configuration; the message names the offending key."""


class RunDirError(AnalysisError):
    """An evaluation run directory that cannot be read or written (missing results, invalid run.json)."""
