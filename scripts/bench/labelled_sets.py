"""Results kept as labelled sets (a 'before' and an 'after', say) in one JSON beside its
markdown: what gpu_activity_memory.py and report_memory.py write.

    save_set("results", "report-memory", "after", {"figures": ...}, markdown,
             "scripts/bench/report_memory.py", commit=None)
"""
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys

from export import cpu_model, mem_total_gb   # scripts/bench/

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def save_set(results: str, name: str, label: str, entry: dict, markdown, script: str,
             commit: str = None, merge: str = None) -> dict:
    """Put ``entry`` as set ``label`` of results/NAME.json (date, command, commit added;
    ``merge``: a key of entry whose dict is merged into the set's earlier one), the machine
    beside it, and results/NAME.md as ``markdown(doc)`` makes it."""
    os.makedirs(results, exist_ok=True)
    path = os.path.join(results, f"{name}.json")
    doc = {}
    if os.path.exists(path):
        with open(path) as f:
            doc = json.load(f)
    sets = doc.setdefault("sets", {})
    if merge:
        entry = {**entry, merge: {**sets.get(label, {}).get(merge, {}), **entry[merge]}}
    sets[label] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", script] + sys.argv[1:]),
        "commit": commit or subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                           capture_output=True, text=True).stdout.strip()
        or "unknown", **entry}
    doc["machine"] = {"nproc": os.cpu_count(), "cpu": cpu_model(), "mem_gb": mem_total_gb(),
                      "python": platform.python_version(), "platform": platform.platform()}
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
    with open(os.path.join(results, f"{name}.md"), "w") as f:
        f.write(markdown(doc))
    return doc
