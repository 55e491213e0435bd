"""`/api/v1/tokens`: make, list and revoke API tokens (admin only)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from provisiond.api.v1 import Name, Page, Role, config, route
from provisiond.service import tokens


class TokenInfo(BaseModel):
    name: str
    role: Literal["reader", "operator", "admin"]
    created: float = Field(description="Unix time")
    expires: float | None = Field(None, description="Unix time; null: never")


class NewToken(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name = Field(description="a DNS label, unique among tokens")
    role: Literal["reader", "operator", "admin"]
    expires_in: float | None = Field(None, gt=0, le=10 * 365 * 86400,
                                     description="seconds until it expires; null: never")


class CreatedToken(TokenInfo):
    token: str = Field(description="the token itself: shown this once, stored only hashed")


@route("/tokens", "GET", role=Role.ADMIN, summary="List tokens (never the tokens themselves)",
       response=Page[TokenInfo])
def list_tokens(principal, body, query):
    return {"items": tokens.list_tokens(config()), "continue": None}


@route("/tokens", "POST", role=Role.ADMIN, summary="Make a token; the answer shows it once",
       body=NewToken, response=CreatedToken, status=201)
def create_token(principal, body: NewToken, query):
    token, record = tokens.create_token(config(), principal.actor, body.name,
                                        Role.parse(body.role), body.expires_in)
    return {**record, "token": token}


class TokenName(BaseModel):
    name: Name


@route("/tokens/<name>", "DELETE", role=Role.ADMIN, summary="Revoke a token", status=204,
       path=TokenName)
def revoke_token(principal, body, query, name: str):
    tokens.revoke_token(config(), principal.actor, name)
