"""The admin API for tokens: make one (its secret shown once), list them, revoke one."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response, status

from service.deps import get_state
from service.edge import revoked_meanwhile
from service.errors import InvalidRequest, NotFound
from service.state import ServiceState
from service.tokens import store
from service.tokens.schemas import TokenCreated, TokenList, TokenRequest, TokenView

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])
State = Annotated[ServiceState, Depends(get_state)]
TokenId = Annotated[str, Path(min_length=1, max_length=32)]


@router.post("", response_model=TokenCreated, status_code=status.HTTP_201_CREATED)
def create_token(body: TokenRequest, state: State) -> dict[str, Any]:
    """Make a token. The answer holds its secret (``token``): it is not stored, only its hash."""
    scope = store.Scope(frozenset(body.nodes), body.region)
    # A route waits for a worker thread after its token check: a token revoked meanwhile
    # (the holder of a stolen admin token, about to be cut off) makes no token to keep.
    revoked_meanwhile.refuse_if_revoked()
    try:
        record, secret = store.create(state.engine, body.role, scope, body.name, state.clock())
    except store.ScopeError as exc:
        raise InvalidRequest(exc.field, str(exc)) from None
    return {**record.view(), "token": secret}


@router.get("", response_model=TokenList)
def list_tokens(
    state: State, revoked: Annotated[bool, Query(description="include revoked ones")] = False
) -> dict[str, Any]:
    """The tokens, oldest first: never a secret or a hash."""
    return {"tokens": [r.view() for r in store.listed(state.engine, include_revoked=revoked)]}


@router.delete("/{token_id}", status_code=status.HTTP_204_NO_CONTENT)
def revoke_token(token_id: TokenId, state: State, request: Request) -> Response:
    """Revoke a token: refused by this process at once, by every other within a second."""
    revoked_meanwhile.refuse_if_revoked()
    record = store.revoke(state.engine, token_id, state.clock())
    if record is None:
        raise NotFound(f"no token {token_id!r}")
    request.app.state.token_check.drop(token_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


__all__ = ["TokenView", "router"]
