"""Test support: a Chrome JSON trace read back (json module) into what each event means,
whatever text the writer chose, and that content in one canonical form.

Each event becomes its phase, name, category, pid/tid, time and duration in integer
nanoseconds (read from the µs text exactly, with decimal.Decimal), flow, binding point,
scope (an instant's is "t" unless it names another: the format's default) and args; a flow event's id becomes the pid, tid and time of the "s" that starts
its flow (a viewer pairs flow events by id, category and name: the number itself means
nothing); args a writer left out because they hold the default the trace's
"clockalign" metadata record names (its args' "defaults") are put back first, so a writer
that says a default once gives the same content as one that writes it on every event.
The run's path in that record is cut to its file name (tests write runs in scratch dirs).

    c = content(open("run.json", "rb").read())     # {"X": [...], "M": [...], ...}, sorted
    digests(c)                                     # one sha256 and count per part
"""
import decimal
import hashlib
import json
import os


def _ns(v) -> int:
    """µs as JSON gave it (Decimal or int) -> exact int ns."""
    ns = decimal.Decimal(v) * 1000
    assert ns == ns.to_integral_value(), f"{v} µs is not a whole number of ns"
    return int(ns)


def _defaults(head: dict) -> list:
    return (head.get("args") or {}).get("defaults") or []


def _applies(rule: dict, e: dict) -> bool:
    """A default rule's "when": every key names a value the event has ("cat", "ph", a
    list of them), "with" args the event must have and "without" args it must lack."""
    when = rule.get("when", {})
    args = e.get("args") or {}
    for k, want in when.items():
        if k == "without":
            if any(a in args for a in want):
                return False
        elif k == "with":
            if not all(a in args for a in want):
                return False
        elif e.get(k) not in (want if isinstance(want, list) else [want]):
            return False
    return True


def with_defaults(evs: list) -> list:
    """The events, each given the args the trace's defaults say it left out."""
    head = next(e for e in evs if e.get("ph") == "M" and e.get("name") == "clockalign")
    rules = _defaults(head)
    for e in evs:
        if e.get("ph") == "M":
            continue
        for rule in rules:
            if _applies(rule, e):
                args = e.setdefault("args", {})
                for k, v in rule["args"].items():
                    args.setdefault(k, v)
    return evs


def loads(text) -> dict:
    """The trace as json.loads reads it, its events' defaults put back (for tests that
    look at events' args)."""
    doc = json.loads(text)
    with_defaults(doc["traceEvents"])
    return doc


def events(data: bytes) -> tuple:
    """(the events with defaults put back, exact numbers; the document's other keys)."""
    doc = json.loads(data, parse_float=decimal.Decimal)
    evs = doc.pop("traceEvents")
    return with_defaults(evs), doc


def _plain(v):
    if isinstance(v, decimal.Decimal):
        return str(v.normalize()) if v != v.to_integral_value() else int(v)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def content(data: bytes) -> dict:
    """What the trace shows (module doc): events by phase, each list sorted."""
    evs, doc = events(data)
    starts = {(e.get("cat"), e.get("name"), _plain(e["id"])): [e.get("pid"), e.get("tid"),
                                                              _ns(e["ts"])]
              for e in evs if e.get("ph") == "s"}
    out = {}
    for e in evs:
        e = dict(e)
        row = {"ph": e.pop("ph"), "name": e.pop("name", None), "cat": e.pop("cat", None),
               "pid": e.pop("pid", None), "tid": e.pop("tid", None)}
        if "ts" in e:
            row["ts"] = _ns(e.pop("ts"))
        if "dur" in e:
            row["dur"] = _ns(e.pop("dur"))
        args = _plain(e.pop("args", None))
        if row["ph"] == "M" and row["name"] == "clockalign":
            args = dict(args)
            args["run"] = os.path.basename(args["run"])
            args.pop("defaults", None)
        row["args"] = args
        if "id" in e:              # a flow: named by where it starts (ids are per cat, name)
            row["id"] = starts.get((row["cat"], row["name"], _plain(e.pop("id"))))
        if row["ph"] in ("i", "I"):     # an instant's scope: thread unless it says so
            row["s"] = e.pop("s", "t")
        if "bp" in e:
            row["bp"] = e.pop("bp")
        assert not e, f"fields not read: {sorted(e)}"
        out.setdefault(row["ph"], []).append(row)
    key = lambda r: json.dumps(r, sort_keys=True)       # noqa: E731
    c = {ph: sorted(rows, key=key) for ph, rows in out.items()}
    other = _plain(doc)
    other.pop("displayTimeUnit", None)          # the viewer's display choice, not content
    c["document"] = [other]
    return c


def digests(c: dict) -> dict:
    """sha256 and count of each part of content(): equal digests, equal content."""
    return {k: {"n": len(v), "sha256": hashlib.sha256(
        json.dumps(v, sort_keys=True).encode()).hexdigest()} for k, v in c.items()}
