"""Tables and figures in the paper's layouts, rendered from tidy result rows."""
from .detector_table import detector_table_markdown

__all__ = ["detector_table_markdown"]
