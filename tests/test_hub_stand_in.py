"""The stand-in Hub answers as huggingface.co does over the wire: connections kept alive."""

from __future__ import annotations

import httpx2
import pytest
from hubserver import HubServer, Repo
from huggingface_hub import get_session, hf_hub_url


def test_the_client_reuses_one_connection_and_a_stopped_hub_answers_on_none() -> None:
    hub = HubServer([Repo("org/tiny", files={"config.json": b"{}"})]).start()
    url = hf_hub_url("org/tiny", "config.json", endpoint=hub.url)
    try:
        for _ in range(3):
            get_session().get(url).raise_for_status()
        # huggingface.co keeps connections alive and the client pools them: three reads, one
        # connection. A stand-in that closed each one would bill every read a connect.
        assert len({entry["client_port"] for entry in hub.requests}) == 1
    finally:
        hub.stop()
    # A test stops the stand-in to mean an outage: the connection the client still holds must
    # not go on being answered by the stopped server's handler thread.
    with pytest.raises(httpx2.ConnectError):
        get_session().get(url)
