"""The operator reads only the Secrets it is meant to: a test's Hub token Secret, and only when
it is labelled modelsupport.dev/hub-token=true. It asks the API server for the name *and* the
label, so a Secret without the label (a database password a test names) never reaches it."""

from __future__ import annotations

import base64

from k8s_harness import Harness

SECRETS = "/api/v1/namespaces/default/secrets"


async def test_a_secret_without_the_label_is_never_returned_to_the_operator(
    harness: Harness,
) -> None:
    h = harness
    h.settings.read_token_secrets = True
    await h.create(
        SECRETS,
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db-password"},
         "data": {"token": base64.b64encode(b"s3cr3t").decode()}},
    )  # fmt: skip
    await h.start_operator()
    spec = {"model": "org/gated-llama", "hubTokenSecret": {"name": "db-password"}}
    await h.create_test("peek", spec)
    status = await h.wait_status("peek", lambda s: s.get("phase") == "Invalid", "Invalid")
    assert "lacks the label modelsupport.dev/hub-token=true" in status["message"]
    reads = [
        r for r in h.requests() if r.method.value == "GET" and str(r.url.path).startswith(SECRETS)
    ]
    # Never a GET of the Secret by name (it answers whatever its labels); a list selected by
    # its name and the label, which the API server answers with labelled Secrets only.
    assert reads and not [r for r in reads if str(r.url.path) != SECRETS]
    for read in reads:
        assert read.params["fieldSelector"] == "metadata.name=db-password"
        assert read.params["labelSelector"] == "modelsupport.dev/hub-token=true"
