"""Node public keys: register (first key wins), read, delete; bad keys refused whole."""

from __future__ import annotations

import base64
import os

from fastapi.testclient import TestClient


def _key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def test_register_read_and_reregister_the_same_key(client: TestClient) -> None:
    key = _key()
    first = client.put("/v1/nodes/n1/key", json={"public_key": key})
    assert first.status_code == 200, first.text
    assert first.json()["public_key"] == key and first.json()["algorithm"] == "ed25519"
    again = client.put("/v1/nodes/n1/key", json={"algorithm": "ed25519", "public_key": key})
    assert again.status_code == 200 and again.json() == first.json()
    assert client.get("/v1/nodes/n1/key").json() == first.json()


def test_a_different_key_is_a_conflict_until_the_old_one_is_deleted(client: TestClient) -> None:
    old, new = _key(), _key()
    assert client.put("/v1/nodes/n1/key", json={"public_key": old}).status_code == 200
    refused = client.put("/v1/nodes/n1/key", json={"public_key": new})
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "conflict"
    assert refused.json()["error"]["detail"] == {"field": "public_key"}
    assert client.get("/v1/nodes/n1/key").json()["public_key"] == old
    assert client.delete("/v1/nodes/n1/key").status_code == 204
    assert client.put("/v1/nodes/n1/key", json={"public_key": new}).status_code == 200
    assert client.get("/v1/nodes/n1/key").json()["public_key"] == new


def test_bad_keys_and_names_are_refused_and_nothing_is_stored(client: TestClient) -> None:
    short = base64.b64encode(b"x" * 31).decode()
    for body, field in (
        ({"public_key": short}, "public_key"),
        ({"public_key": "not base64!"}, "public_key"),
        ({"public_key": _key(), "algorithm": "rsa"}, "algorithm"),
    ):
        response = client.put("/v1/nodes/n1/key", json=body)
        assert response.status_code == 422, body
        assert response.json()["error"]["detail"]["field"] == field
    bad_name = client.put("/v1/nodes/Bad_Name/key", json={"public_key": _key()})
    assert bad_name.status_code == 422
    assert bad_name.json()["error"]["detail"]["field"] == "path.name"
    assert client.get("/v1/nodes/n1/key").status_code == 404
    assert client.get("/v1/nodes/Bad_Name/key").status_code == 404


def test_unknown_keys_are_not_found(client: TestClient) -> None:
    assert client.get("/v1/nodes/nobody/key").json()["error"]["code"] == "not_found"
    assert client.delete("/v1/nodes/nobody/key").status_code == 404
