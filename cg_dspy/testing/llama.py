"""llama-cpp-python's own OpenAI-compatible server (`python -m llama_cpp.server`) on the
bundled GGUF, started as a real process on loopback: the third-party server the tests
and benchmarks drive as a user would, one place for how it is started and awaited."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc: subprocess.Popen, what: str, timeout: float = 180.0) -> None:
    """Return once `url/models` answers (an HTTP error is an answer: a proxy asking for its
    key is up); RuntimeError when the process exits or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"{url}/models", timeout=2).read()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.5)


def start_server(*flags: str, n_ctx: int = 8192) -> tuple[str, subprocess.Popen]:
    """The bundled GGUF served on a free port: its `/v1` URL once it answers, and the
    process (the caller stops it). `flags` go to the server (`--n_threads 1`, ...)."""
    from cg_dspy.lms import find_local_gguf

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(find_local_gguf()),
                             "--n_ctx", str(n_ctx), "--host", "127.0.0.1", "--port", str(port), *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    wait_up(url, proc, "llama_cpp.server")
    return url, proc
