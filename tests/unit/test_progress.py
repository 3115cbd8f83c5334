"""progress.render: the one-line bar `blackbox send` draws on a terminal."""

from __future__ import annotations

import io

import pytest

from blackbox.cli.progress import Progress, render


class Terminal(io.StringIO):
    """A captured stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("done", "total", "elapsed", "line"),
    [
        pytest.param(0, 1000, 0.0, "[" + "." * 30 + "] 0/1000   0% 0/s", id="nothing-yet"),
        pytest.param(700, 1000, 2.0, "[" + "#" * 21 + "." * 9 + "] 700/1000  70% 350/s", id="70%"),
        pytest.param(1, 3, 1.0, "[" + "#" * 10 + "." * 20 + "] 1/3  33% 1/s", id="a-third"),
        pytest.param(1000, 1000, 0.5, "[" + "#" * 30 + "] 1000/1000 100% 2,000/s", id="full"),
        pytest.param(0, 0, 0.0, "[" + "#" * 30 + "] 0/0 100% 0/s", id="total-0"),
    ],
)
def test_render(done: int, total: int, elapsed: float, line: str) -> None:
    """The bar fills in thirtieths, then count, percentage and rate; nothing to do is done."""
    assert render(done, total, elapsed) == line


def test_render_width_is_fixed() -> None:
    """The bar is 30 characters at every step and only ever fills, so redraws overwrite cleanly."""
    bars = [render(done, 100, 1.0).split("]")[0] for done in range(101)]
    assert {len(bar) for bar in bars} == {31}
    filled = [bar.count("#") for bar in bars]
    assert filled == sorted(filled)
    assert (filled[0], filled[-1]) == (0, 30)


def test_progress_is_silent_off_a_terminal() -> None:
    """Piped or redirected, the progress bar writes nothing at all."""
    stream = io.StringIO()
    with Progress(5, stream) as progress:
        progress.show(5)
    assert stream.getvalue() == ""


def test_progress_draws_the_final_state_and_ends_the_line() -> None:
    """On a terminal the finished bar is always drawn, and leaving ends its line."""
    stream = Terminal()
    with Progress(5, stream) as progress:
        progress.show(5)
        progress.show(5)
    lines = stream.getvalue().split("\r")[1:]
    assert len(lines) == 2
    assert all(line.startswith("[" + "#" * 30 + "] 5/5 100% ") for line in lines)
    assert stream.getvalue().endswith("/s\n")
