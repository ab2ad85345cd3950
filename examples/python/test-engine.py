#!/usr/bin/env python3
"""Runs engine.py as a consumer against a real aquad and aqua-producer on simulated GPUs: it
borrows, writes, and keeps its data through a reclaim the producer makes by raising its load.
Needs AQUA_BUILD (the build folder); run by test-python, in the build's virtual environment
(python/setup-venv), which has the aqua package."""
import os
import shutil
import subprocess
import sys
import tempfile
import time

build = os.environ["AQUA_BUILD"]
here = os.path.dirname(os.path.abspath(__file__))
tmp = tempfile.mkdtemp(prefix="aqua-python.", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
env = dict(os.environ,
           AQUA_CUDA_LIBRARY=os.path.join(build, "simcuda", "libcuda.so.1"),
           AQUA_LIBRARY=os.path.join(build, "libaqua", "libaqua.so.0"),
           AQUA_SIM_MACHINE=f"python-{os.getpid()}", AQUA_SIM_RUNTIME_DIR=tmp,
           AQUA_SIM_DEVICES="2x1GiB", AQUA_ENDPOINT=f"ipc://{tmp}/aquad.sock",
           AQUA_SIDE_PATH=f"{tmp}/aquad.side")
# Only engine.py is Python: the daemon and producer must not get libasan preloaded or its options.
native = {k: v for k, v in env.items() if k not in ("LD_PRELOAD",)}
procs = []


def start(name, *argv, **kw):
    log = open(os.path.join(tmp, name + ".log"), "w")
    p = subprocess.Popen(argv, env=kw.get("env", native), stdout=kw.get("stdout", log),
                         stderr=subprocess.STDOUT, text=True)
    procs.append(p)
    return p


def wait_for(path, text, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with open(path) as f:
            if text in f.read():
                return
        time.sleep(0.05)
    raise TimeoutError(f"no '{text}' in {path}")


def set_load(v):
    with open(os.path.join(tmp, "load.new"), "w") as f:
        f.write(f"{v}\n")
    os.replace(os.path.join(tmp, "load.new"), os.path.join(tmp, "load"))


try:
    with open(os.path.join(tmp, "aquad.yaml"), "w") as f:
        f.write(f"endpoint: {env['AQUA_ENDPOINT']}\nside-socket: {env['AQUA_SIDE_PATH']}\n"
                f"journal: {tmp}/journal\nreclaim-deadline: 5s\n")
    start("aquad", os.path.join(build, "daemon", "aquad"), "-c", os.path.join(tmp, "aquad.yaml"))
    wait_for(os.path.join(tmp, "aquad.log"), "Ready", 20)
    set_load(0.2)
    start("producer", os.path.join(build, "examples", "producer", "aqua-producer"),
          "--backend", "aqua", "--device", "1", "--load-file", os.path.join(tmp, "load"),
          "--capacity", "1GiB", "--weights", "256MiB", "--activation-peak", "704MiB",
          "--margin", "64MiB", "--chunk", "32MiB", "--min-offer", "32MiB")
    wait_for(os.path.join(tmp, "producer.log"), " offer ", 20)

    engine = start("engine", sys.executable, os.path.join(here, "engine.py"), "--wait-reclaim",
                   "30", env=env, stdout=subprocess.PIPE)
    out = []
    for line in engine.stdout:
        print("engine.py | " + line, end="", flush=True)
        out.append(line)
        if line.startswith("waiting for a reclaim"):
            set_load(1.0)
    rc = engine.wait(60)
    for name in ("aquad", "producer"):
        with open(os.path.join(tmp, name + ".log")) as f:
            print("".join(f"{name} | {l}" for l in f), end="")
    text = "".join(out)
    ok = rc == 0 and "ok moved=" in text and "0 bad" in text and "moved=0" not in text
    print("PASS" if ok else f"FAIL (engine.py exit status {rc})")
    sys.exit(0 if ok else 1)
finally:
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    shutil.rmtree(tmp, ignore_errors=True)
