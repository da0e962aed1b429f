"""An MCP server behind OAuth 2.1, for the tests of Agentry's MCP client
(discovery, dynamic registration, PKCE, token refresh, expiry).

Written against the official Python SDK, `mcp` 2.3.0 (scripts/mcp-servers.sh),
with the SDK's own auth machinery: the server is both the MCP resource server
and its own authorization server, backed by an in-memory provider. Run it with
that virtualenv's python:

    python oauth_server.py --port N
        Serve on 127.0.0.1 only and print "listening on N" to stderr once
        connections are accepted (--port 0 picks a free port; the line names
        it). ISSUER below is http://127.0.0.1:N (no trailing slash).

Endpoints:

  ISSUER/mcp        MCP streamable HTTP; needs `Authorization: Bearer TOKEN`.
                    Without a valid token: 401 with
                    `WWW-Authenticate: Bearer error="invalid_token", ...,
                    resource_metadata="ISSUER/.well-known/oauth-protected-resource/mcp"`.
  ISSUER/.well-known/oauth-protected-resource/mcp
                    RFC 9728 metadata: resource ISSUER/mcp, authorization
                    server ISSUER.
  ISSUER/.well-known/oauth-authorization-server
                    RFC 8414 metadata (issuer ISSUER).
  ISSUER/register   RFC 7591 dynamic registration (public clients with
                    token_endpoint_auth_method "none", or secret clients).
  ISSUER/authorize  Auto-approves: 302 straight to the registered redirect_uri
                    with `code` and `state`. `resource` is optional; if given
                    it must name ISSUER/mcp (else error=invalid_target).
  ISSUER/token      authorization_code (PKCE S256 checked by the SDK) and
                    refresh_token grants. Refresh tokens rotate: each refresh
                    returns a new one and the old one is refused (the old
                    access token stays valid until it expires).
  ISSUER/stats      No auth. JSON {"registered", "codes", "tokens",
                    "refreshes", "calls"}: clients registered, codes issued,
                    access tokens issued, refresh grants served, tool calls.

Scopes: whatever the client asks for is granted; without a scope it gets the
one it registered with, or "mcp".

Environment: FIXTURE_ACCESS_TTL=seconds (default 3600) is the life of an
access token (the token response's expires_in); expired tokens get a 401.

Tool: whoami {} -> "authorized as CLIENT_ID" (the client id of the token).
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import sys
import time
from typing import Any

import anyio
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    AuthorizeError,
    RefreshToken,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

ACCESS_TTL = int(os.environ.get("FIXTURE_ACCESS_TTL", "3600"))
DEFAULT_SCOPE = "mcp"


class OpenClient(OAuthClientInformationFull):
    """A registered client that may ask for any scope at /authorize."""

    def validate_scope(self, requested_scope: str | None) -> list[str] | None:
        return requested_scope.split() if requested_scope else None


class Provider:
    """In-memory OAuthAuthorizationServerProvider that approves everything."""

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self.clients: dict[str, OpenClient] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, tuple[AccessToken, float]] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.stats = {"registered": 0, "codes": 0, "tokens": 0, "refreshes": 0, "calls": 0}

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        self.clients[client_info.client_id] = OpenClient.model_validate(client_info.model_dump())
        self.stats["registered"] += 1

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        if params.resource and params.resource.rstrip("/") != self.resource:
            raise AuthorizeError("invalid_target", f"this server is {self.resource}, not {params.resource}")
        scopes = params.scopes or (client.scope or DEFAULT_SCOPE).split()
        code = secrets.token_urlsafe(32)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=scopes,
            expires_at=time.time() + 300,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource or self.resource,
        )
        self.stats["codes"] += 1
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client: OAuthClientInformationFull, code: str) -> AuthorizationCode | None:
        return self.codes.get(code)

    async def exchange_authorization_code(self, client: OAuthClientInformationFull, code: AuthorizationCode) -> OAuthToken:
        del self.codes[code.code]  # one use only
        return self.issue(client.client_id, code.scopes, code.resource)

    async def load_refresh_token(self, client: OAuthClientInformationFull, refresh_token: str) -> RefreshToken | None:
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        del self.refresh[refresh_token.token]  # rotation: the old one is spent
        self.stats["refreshes"] += 1
        return self.issue(client.client_id, scopes, refresh_token.resource)

    async def load_access_token(self, token: str) -> AccessToken | None:
        found = self.access.get(token)
        if found is None or time.time() >= found[1]:
            return None
        return found[0]

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)

    def issue(self, client_id: str, scopes: list[str], resource: str | None) -> OAuthToken:
        access, refresh = "at-" + secrets.token_urlsafe(24), "rt-" + secrets.token_urlsafe(24)
        deadline = time.time() + ACCESS_TTL
        self.access[access] = (
            AccessToken(token=access, client_id=client_id, scopes=scopes, expires_at=int(deadline), resource=resource),
            deadline,
        )
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes, resource=resource)
        self.stats["tokens"] += 1
        return OAuthToken(
            access_token=access,
            expires_in=ACCESS_TTL,
            scope=" ".join(scopes),
            refresh_token=refresh,
        )


def build(port: int) -> tuple[MCPServer[Any], Provider]:
    issuer = f"http://127.0.0.1:{port}"
    provider = Provider(f"{issuer}/mcp")
    server = MCPServer(
        name="agentry-oauth-fixture",
        version="1.0.0",
        log_level="WARNING",
        auth_server_provider=provider,
        auth=AuthSettings(
            issuer_url=issuer,
            resource_server_url=f"{issuer}/mcp",
            validate_token_resource=True,
            client_registration_options=ClientRegistrationOptions(enabled=True, default_scopes=[DEFAULT_SCOPE]),
        ),
    )

    @server.tool()
    async def whoami() -> str:
        """Names the OAuth client whose token made this call."""
        provider.stats["calls"] += 1
        token = get_access_token()
        return f"authorized as {token.client_id if token else '(nobody)'}"

    @server.custom_route("/stats", methods=["GET"])
    async def stats(_request: Any) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse(provider.stats)

    return server, provider


async def serve(port: int) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    bound = sock.getsockname()[1]
    server, _ = build(bound)
    app = server.streamable_http_app(host="127.0.0.1")
    http = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2))

    async def announce() -> None:
        while not http.started:
            await anyio.sleep(0.01)
        print(f"listening on {bound}", file=sys.stderr, flush=True)

    async with anyio.create_task_group() as group:
        group.start_soon(announce)
        await http.serve(sockets=[sock])
        group.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description="MCP server behind OAuth 2.1 (mcp 2.3.0)")
    parser.add_argument("--port", type=int, required=True)
    anyio.run(serve, parser.parse_args().port)


if __name__ == "__main__":
    main()
