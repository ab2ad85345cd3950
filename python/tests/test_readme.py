"""The engine script of python/README.md, run as written: a consumer process borrows into a
tensor, writes, survives the reclaim a producer (another process) makes, and reads back."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_script() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) == 1, "python/README.md should have exactly one python block"
    return blocks[0]


def test_the_readme_engine_runs_as_written_and_survives_a_reclaim(producer, tmp_path):
    script = readme_script()
    assert len(script.strip().splitlines()) <= 32
    path = tmp_path / "engine.py"
    path.write_text(script)
    producer.eval("ctx.offer(1 << 30)")
    engine = subprocess.Popen([sys.executable, "-P", str(path)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    assert engine.stdout is not None
    out = []
    for line in engine.stdout:
        out.append(line)
        if line.startswith("written"):
            assert line.strip() == "written 64 MiB to peer memory"
            producer.send(eval="ctx.reclaim(aqua.ALL, timeout=60)")
    rc = engine.wait(60)
    text = "".join(out)
    assert rc == 0, text
    assert "survived the reclaim: 64 blocks intact at 0x" in text
    assert producer.reply()["complete"]
