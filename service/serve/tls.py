"""TLS for both faces, from the same files: --tls-cert and --tls-key, and --tls-client-ca for
mutual TLS (clients must then present a certificate that CA signed).

The gRPC server gets its credentials and binds its port here (`bind_grpc_port`), the HTTP face its
SSL context (`ssl_context`). grpc says only "Failed to bind" for a bad key or certificate, so that
error names the TLS files, and a client CA file with no certificate in it is refused by name.
"""

from __future__ import annotations

import ssl

import grpc

from service.serve.config import Settings


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    s = settings.server
    if not s.tls_cert:
        return None
    with open(s.tls_key, "rb") as f:
        key = f.read()
    with open(s.tls_cert, "rb") as f:
        cert = f.read()
    client_ca = read_client_ca(s.tls_client_ca) if s.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=bool(client_ca)
    )


def read_client_ca(path: str) -> bytes:
    """The client CA bundle, refused by name when it holds no PEM certificate: grpc would only
    fail to bind, and the message would blame the (valid) server certificate and key."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise OSError(err.errno, f"cannot read the TLS client CA {path}: {err.strerror}") from err
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise ValueError(
            f"TLS client CA {path} holds no PEM certificate (expected '-----BEGIN CERTIFICATE-----')"
        )
    return data


def bind_grpc_port(server: grpc.aio.Server, settings: Settings) -> int:
    """Bind --host:--port, with TLS when --tls-cert is set; returns the port bound (0 picks a free
    one). A failed bind with TLS names the TLS files too."""
    address = f"{settings.server.host}:{settings.server.port}"
    credentials = server_credentials(settings)
    try:
        return (
            server.add_secure_port(address, credentials)
            if credentials
            else server.add_insecure_port(address)
        )
    except RuntimeError as err:  # grpc says "Failed to bind" for a bad key or certificate too
        if not credentials:
            raise
        s = settings.server
        ca = f", and {s.tls_client_ca} PEM CA certificates" if s.tls_client_ca else ""
        raise RuntimeError(
            f"{err} (or the TLS files are wrong: {s.tls_cert} and {s.tls_key} must be a PEM "
            f"certificate and its private key{ca})"
        ) from err


def ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The gRPC server's certificate and key (and client CA for mutual TLS), for HTTPS."""
    s = settings.server
    if not s.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(s.tls_cert, s.tls_key)
    if s.tls_client_ca:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(s.tls_client_ca)
    return context
