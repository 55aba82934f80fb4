"""The admin API's token shapes: a request to make one, and the token as listed."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from placement.snapshot import NODE_NAME_PATTERN
from placement.text import Text
from service.access import Role

NodeName = Annotated[str, Field(min_length=1, max_length=253, pattern=NODE_NAME_PATTERN)]


class TokenRequest(BaseModel):
    # An unknown field is refused, not dropped: a misspelt one was read as left out.
    model_config = ConfigDict(extra="forbid")

    role: Role
    nodes: list[NodeName] = Field(
        default_factory=list,
        max_length=10_000,
        description="agent tokens: the nodes it may report for",
    )
    region: Text | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        description="agent tokens: a whole region; region tokens: their own region",
    )
    name: Text = Field(default="", max_length=256, description="what the token is for")


class TokenView(BaseModel):
    id: str
    role: Role
    nodes: list[str]
    region: str | None
    name: str
    created_at: datetime
    revoked_at: datetime | None


class TokenCreated(TokenView):
    token: str = Field(description="the secret: shown this once, never again")


class TokenList(BaseModel):
    tokens: list[TokenView]
