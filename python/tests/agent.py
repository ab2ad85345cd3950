"""A client process for the multi-process tests: runs Python sent by the test, one JSON request
per line on stdin, one JSON reply per line on stdout. The namespace has ``aqua`` imported;
tests open a Producer or Consumer in it, like an engine process would.

    {"exec": "ctx = aqua.Producer(1)"}      -> {"ok": null}
    {"eval": "ctx.offer(4 << 30)"}          -> {"ok": 4294967296}
    {"eval": "poll_until(ctx, 'Migrated')"} -> {"ok": [{"type": "Migrated", ...}, ...]}
    failures                                -> {"err": "NoMemoryError", "msg": "...", "errno": ...}
"""

import dataclasses
import json
import sys
import time
import traceback

import aqua


def plain(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": type(value).__name__,
                **{f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def poll_until(ctx, kind, timeout=30):
    """poll() until an event of class kind (a name) arrives; every event seen, as a list."""
    end = time.monotonic() + timeout
    seen = []
    while time.monotonic() < end:
        seen += ctx.poll(timeout=0.5)
        if any(type(e).__name__ == kind for e in seen):
            break
    return seen


def main():
    ns = {"aqua": aqua, "poll_until": poll_until}
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if "exec" in req:
                exec(req["exec"], ns)
                reply = {"ok": None}
            else:
                reply = {"ok": plain(eval(req["eval"], ns))}
        except aqua.AquaError as e:
            reply = {"err": type(e).__name__, "msg": str(e), "errno": e.errno,
                     "outcome": int(e.outcome) if e.outcome is not None else None}
        except Exception as e:  # a bug in the test's code: show where
            reply = {"err": type(e).__name__, "msg": traceback.format_exc()}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
