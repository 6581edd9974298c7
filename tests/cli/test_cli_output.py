"""The CLI's output ends cleanly when its reader leaves (`hoptrace report --json | head`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit  # no root, no server: make test-unit runs it without root


def cli(*args: str) -> list[str]:
    """argv of the `hoptrace` CLI in a child with this interpreter's site directories and no others (make
    test-unit runs Debian's python with the venv's added at run time, the editable install's finder with
    them; -S keeps Debian's dist-packages and their older protobuf out)."""
    sites = [path for path in sys.path if path.endswith("site-packages")]
    code = (
        f"import site, sys; [site.addsitedir(p) for p in {sites!r}]; "
        "from hoptrace.cli.main import main; sys.exit(main(sys.argv[1:]))"
    )
    return [sys.executable, "-S", "-c", code, *args]


def test_a_reader_that_left_gets_no_traceback() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line is written
    try:
        run = subprocess.run(
            cli("version", "--dispatcher", "127.0.0.1:9", "--insecure"),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in run.stderr and "BrokenPipeError" not in run.stderr, run.stderr
    assert run.returncode == 141, (run.returncode, run.stderr)


def complete(script: str, *words: str) -> list[str]:
    """What bash offers after `words` with `script` sourced (the last word is the one being completed)."""
    line = " ".join(words)
    program = (
        f"source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; COMP_LINE='{line}'; "
        'COMP_POINT=${#COMP_LINE}; _shtab_hoptrace; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    out = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.split()


def test_bash_completion_knows_every_command_and_flag(tmp_path) -> None:
    script = tmp_path / "hoptrace.bash"
    generated = subprocess.run(
        cli("completion", "bash"),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    script.write_text(generated.stdout)
    assert complete(str(script), "hoptrace", "tr") == ["trace"]
    assert complete(str(script), "hoptrace", "trace", "ap") == ["apply"]
    assert complete(str(script), "hoptrace", "report", "--si") == ["--since"]
    # The collector's own flags (loaded only when it is the command) are there too.
    assert complete(str(script), "hoptrace", "collector", "--kafka-b") == ["--kafka-brokers"]


def test_mace_on_this_machine_says_a_container_name_needs_the_dispatcher() -> None:
    run = subprocess.run(
        cli("mace", "--container", "container:web"), capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert "error: --container container:web: a container or pod is resolved by the dispatcher" in run.stderr
    assert "add --node NODE" in run.stderr
