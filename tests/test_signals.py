"""signals_held(): Ctrl-C and SIGTERM noted during a critical stretch, delivered after."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from meridian.signals import signals_held


def test_a_signal_inside_is_raised_once_the_block_ends() -> None:
    reached = []
    with pytest.raises(KeyboardInterrupt), signals_held():
        os.kill(os.getpid(), signal.SIGINT)
        reached.append("after the signal")  # the block itself runs on
    assert reached == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_sigterm_goes_to_the_handler_that_was_there() -> None:
    got: list[int] = []
    saved = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        with signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            assert got == []
        assert got == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, saved)


def test_nested_blocks_deliver_at_the_outer_end() -> None:
    with pytest.raises(KeyboardInterrupt), signals_held():
        with signals_held():
            os.kill(os.getpid(), signal.SIGINT)
        inner_done = True
    assert inner_done


def test_ignore_drops_them() -> None:
    with signals_held(ignore=True):
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_off_the_main_thread_it_changes_nothing() -> None:
    seen: list[object] = []

    def worker() -> None:
        with signals_held():
            seen.append(signal.getsignal(signal.SIGINT))

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == [signal.default_int_handler]
