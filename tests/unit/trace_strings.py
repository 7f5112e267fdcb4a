"""Test support: every string annotation of a Perfetto trace checked against the run's
``clockalign dump`` rows and ``clockalign faults --json`` (what a user reads elsewhere).

    check_strings(trace_path, dump_rows, faults_json)   # AssertionError names the mismatch
"""
import collections

from clockalign.timeline.codes import cuda_result_name

from .test_export import check_trace, parse

FAULT_KEYS = {"kind", "sources", "message", "sightings", "step"}


def _expected(key, row):
    """What an event annotation named key must read, from the dump row; KeyError if the
    dump has nothing to compare it with."""
    if key == "result":
        if row["kind"] == "connect":
            return "OK" if row["ret"] >= 0 else row["errno"]
        return cuda_result_name(row["ret"])
    if key == "state":
        return row["prev_state"]
    if key in ("grid", "block"):
        return "x".join(map(str, row[key]))
    if key == "func" and isinstance(row.get(key), int):
        return f"@{row[key]:#x}"                  # '<kernel name> @0x...'
    value = row[key]
    if not isinstance(value, str):
        raise KeyError(key)
    return value


def check_strings(trace_path, dump_rows, faults_json) -> collections.Counter:
    """Every string annotation of every event slice/instant equals its dump field (the
    func of a named launch ends with its pointer), every fault's message is the one
    ``faults --json`` gives; returns how many of each key were checked."""
    seen = check_trace(parse(trace_path))
    by_t = collections.defaultdict(list)
    for row in dump_rows:
        by_t[row["t_ns"]].append(row)
    faults = {(f["kind"], f.get("message") or "") for f in faults_json["faults"]}
    steps = {str(e.get("what", "")) for f in faults_json["faults"] for e in f.get("chain") or []}
    checked = collections.Counter()
    items = [(b, name, anns) for _, name, b, _, anns in seen["slices"]] + \
            [(t, name, anns) for _, name, t, anns in seen["instants"]]
    for t, name, anns in items:
        strings = {k: v for k, v in anns.items() if isinstance(v, str)}
        if not strings:
            continue
        if "step" in anns:                            # a step of a fault's chain
            assert anns["message"] in steps, f"{name!r}: step {anns['message']!r}"
            checked["step message"] += 1
            continue
        if "kind" in anns:                            # a fault's instant
            assert (anns["kind"], anns.get("message", "")) in faults, \
                f"fault {name!r}: {anns.get('message')!r} not in faults --json"
            for s in faults_json["faults"]:
                if s.get("message", "") == anns.get("message", "") and s["kind"] == anns["kind"]:
                    for sight in s.get("sightings") or []:
                        assert f"{sight['source']} @" in anns["sources"], (anns, sight)
            checked.update(k for k in strings if k in ("kind", "message", "sources"))
            continue
        rows = by_t.get(t)
        assert rows, f"{name!r} at {t}: no dump row at that time"

        def matches(row):
            for k, v in strings.items():
                try:
                    want = _expected(k, row)
                except KeyError:
                    return False
                if not (v.endswith(want) if k == "func" else v == want):
                    return False
            return True
        assert any(matches(r) for r in rows), \
            f"{name!r} at {t}: {strings} vs dump {rows}"
        checked.update(strings.keys())
    return checked
