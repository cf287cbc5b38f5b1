"""What the command line prints of a record is data: a runner pod that wrote terminal escape
sequences into its document (an OSC 52 clipboard write, a clear-screen) gets them shown as
escapes, never acted on by the terminal."""

from __future__ import annotations

import re
from pathlib import Path

from factories import NEURON_STACK, make_record
from typer.testing import CliRunner

from model_support.cli import app
from model_support.printable import printable
from model_support.store import ResultsStore

CLIPBOARD_AND_CLEAR = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07\x1b[2J\x1b[H"
ACTS_ON_A_TERMINAL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def test_reproduce_shows_a_records_control_characters_as_escapes(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "results")
    stack = NEURON_STACK.model_copy(update={"instance_type": "trn2.48xlarge" + CLIPBOARD_AND_CLEAR})
    record = make_record(stack=stack, run_py="# run.py\nCONFIG = {}\n")
    store.add(record)
    result = CliRunner().invoke(
        app,
        ["reproduce", record.run_id, "--results", str(store.uri), "-o", str(tmp_path / "out")],
        env={"COLUMNS": "400"},
    )
    assert result.exit_code == 0, result.output
    assert ACTS_ON_A_TERMINAL.search(result.output.replace("\n", "")) is None
    assert "trn2.48xlarge\\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\\x07\\x1b[2J" in result.output


def test_every_control_character_but_tab_and_newline_is_escaped() -> None:
    assert printable("a\tb\nc") == "a\tb\nc"
    assert printable("\x1b[2J\r\x08\x7f\x9b\u202e") == "\\x1b[2J\\x0d\\x08\\x7f\\x9b\\u202e"


def test_every_console_of_the_command_line_escapes_control_characters() -> None:
    """A command that printed through a plain Rich console would hand a record's escape
    sequences to the terminal: the command line's consoles are all DataConsoles."""
    import model_support.cli

    folder = Path(model_support.cli.__file__).parent
    plain = [
        f"{source.name}:{number}"
        for source in sorted(folder.glob("*.py"))
        for number, line in enumerate(source.read_text().splitlines(), 1)
        if re.search(r"(?<!Data)Console\(", line)
    ]
    assert plain == []
