"""What a caller and the log are told of a database that did not answer."""

from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa

from service import database_unreachable
from service.database_unreachable import MESSAGE, unavailable
from service.log_gate import LOG_EVERY_S, LogGate


def _error(text: str) -> sa.exc.OperationalError:
    return sa.exc.OperationalError("SELECT 1", {}, Exception(text))


def test_the_answer_is_fixed_and_the_log_has_the_drivers_words_once_a_while(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    now = [1000.0]
    monkeypatch.setattr(database_unreachable, "_logged", LogGate(clock=lambda: now[0]))
    caplog.set_level(logging.WARNING, logger="topoplace.service")
    refused = 'connection to server at "db.internal" failed for user "topoplace"'
    for _ in range(50):  # an outage under load: every request meets it
        answer = unavailable(_error(refused))
        assert answer.status == 503 and answer.code == "database_unavailable"
        assert str(answer) == MESSAGE and "db.internal" not in answer.body()["error"]["message"]
    assert caplog.text.count("db.internal") == 1
    unavailable(_error("server closed the connection unexpectedly"))  # other words: told
    assert "server closed the connection" in caplog.text
    now[0] += LOG_EVERY_S
    unavailable(_error(refused))  # the same words, a while later: told again
    assert caplog.text.count("db.internal") == 2
