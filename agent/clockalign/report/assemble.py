"""The report's sections put together, one function a format: the terminal text, report.md
and report.json.

    text(head, sections)      # "clockalign report: ..." then "== Title ==" blocks
    markdown(head, sections)  # "# clockalign report" then "## Title" blocks
    numbers([head] + sections)  # one dict, the sections' numbers in order
    write_json(path, nums)
"""
import json

import numpy as np

from ..store.writer import open_private


def text(head, sections) -> str:
    return "\n".join([head.text] + [f"\n== {s.title} ==\n{s.text}" for s in sections]) + "\n"


def markdown(head, sections) -> str:
    return "".join([head.markdown] + [f"\n## {s.title}\n\n{s.markdown}\n" for s in sections])


def numbers(sections) -> dict:
    nums = {}
    for s in sections:
        nums.update(s.numbers)
    return nums


def write_text(path, s):
    with open_private(path, "w") as fh:
        fh.write(s)


def write_json(path, nums):
    with open_private(path, "w") as fh:
        json.dump(nums, fh, indent=1, default=_json_default)
        fh.write("\n")


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)
