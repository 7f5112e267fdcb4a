"""The alert rules shipped with ``clockalign watch`` (alerts.yml in this package).

The file is valid as shipped (promtool checks it); ``render`` changes the one tunable the
issue asks for, the factor over its own 1 h baseline at which a CUDA call's p99 alerts.

    text = render(p99_factor=2.5)        # clockalign watch --print-rules --p99-factor 2.5
"""
import re
from importlib import resources

from ..errors import ClockalignError

P99_ALERT = "ClockalignCudaCallP99AboveBaseline"
DEFAULT_P99_FACTOR = 3.0
# where the factor appears in that rule: the comparison and the two sentences about it
_FACTOR_AT = (r"(> )3( \* quantile_over_time)", r"(over )3(x its)", r"(than )3( times)")


def rules_text() -> str:
    return (resources.files("clockalign") / "watch" / "alerts.yml").read_text()


def alert_names(text: str = None) -> list:
    return re.findall(r"^\s*- alert: (\w+)", text if text is not None else rules_text(), re.M)


def render(p99_factor: float = DEFAULT_P99_FACTOR) -> str:
    """The rules with the p99 alert's factor set (> 1)."""
    if not p99_factor > 1:
        raise ClockalignError(f"--p99-factor must be more than 1 (got {p99_factor:g})")
    text = rules_text()
    start = text.index(f"- alert: {P99_ALERT}")
    end = text.index("- alert:", start + 1)
    block = text[start:end]
    for pattern in _FACTOR_AT:
        block, n = re.subn(pattern, rf"\g<1>{p99_factor:g}\g<2>", block)
        assert n == 1, pattern
    return text[:start] + block + text[end:]
