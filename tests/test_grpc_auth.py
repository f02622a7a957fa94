"""gRPC authentication (issue 17, item 6) against the real `drafter serve`: bearer tokens and
mutual TLS; an unauthenticated caller is refused (UNAUTHENTICATED) and learns nothing,
probes stay open, and one client's request ids cannot touch another's."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from client_servers import DrafterProcess
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sssd.drafter.v1 import drafter_pb2 as pb
from sssd.drafter.v1 import drafter_pb2_grpc as pb_grpc
from verifier_client import BudgetRule, DrafterClient
from verifier_client.engines import DrafterSettings, EngineDrafter

PATTERN = [10, 11, 12, 13, 14, 15]
ALPHA, BETA = "alpha-token-0123456789", "beta-token-0123456789ab"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DrafterProcess]:
    root = tmp_path_factory.mktemp("auth")
    tokens = root / "tokens"
    tokens.write_text(f"# clients of this drafter\nalpha {ALPHA}\nbeta {BETA}\n")
    server = DrafterProcess(root / "data", "--grpc-tokens-file", str(tokens))
    yield server
    server.stop()


def _client(server: DrafterProcess, token: str | None) -> DrafterClient:
    client = DrafterClient(server.target, deadline_ms=1000, budget=BudgetRule.fixed(4),
                           token=token)  # fmt: skip
    client.wait_ready()
    return client


def test_calls_without_a_valid_token_are_unauthenticated(guarded: DrafterProcess) -> None:
    with grpc.insecure_channel(guarded.target) as channel:
        stub = pb_grpc.DrafterServiceStub(channel)
        ingest = pb.IngestRequest(sequences=[pb.TokenSequence(tokens=[1, 2])])
        calls = [
            lambda md: stub.GetServiceInfo(pb.GetServiceInfoRequest(), metadata=md, timeout=5),
            lambda md: stub.Ingest(ingest, metadata=md, timeout=5),
            lambda md: stub.Draft(pb.DraftRequest(), metadata=md, timeout=5),
            lambda md: stub.Finish(pb.FinishRequest(), metadata=md, timeout=5),
        ]
        for metadata in [(), (("authorization", "Bearer wrong-token-0123456789"),),
                         (("authorization", ALPHA),)]:  # fmt: skip
            for call in calls:
                with pytest.raises(grpc.RpcError) as refused:
                    call(metadata)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # Probes need no token.
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="drafter.v1.DrafterService"), timeout=5
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_one_clients_request_ids_cannot_touch_anothers(guarded: DrafterProcess) -> None:
    alpha, beta = _client(guarded, ALPHA), _client(guarded, BETA)
    try:
        alpha.add_request("r1", [*PATTERN, *PATTERN])
        assert alpha.step({"r1": []}).ok
        # beta uses the same id: a restart (whole context) and then a finish, on its own.
        beta.add_request("r1", [7, 8, 9, 7, 8, 9, 7])
        tree = beta.step({"r1": []})["r1"]
        assert tree is not None and tree.best_chain(2) == [8, 9]
        beta.finish("r1")
        assert beta.flush(10)
        result = alpha.step({"r1": [10]})  # alpha's delta still matches alpha's state
        assert result.resynced == frozenset() and alpha.stats.resyncs == 0
        tree = result["r1"]
        assert tree is not None and tree.best_chain(2) == [11, 12]
    finally:
        alpha.close()
        beta.close()


def test_an_engine_plugin_authenticates_with_its_token_file(
    guarded: DrafterProcess, tmp_path: Path
) -> None:
    token = tmp_path / "engine-token"
    token.write_text(ALPHA + "\n")
    settings = DrafterSettings(address=guarded.target, deadline_ms=1000, budget="4",
                               token_file=str(token))  # fmt: skip
    engine = EngineDrafter(settings)
    try:
        context = [*PATTERN, *PATTERN]
        trees = engine.draft(["e1"], [len(context)], [len(context)],
                             lambda row, a, b: context[a:b])  # fmt: skip
        assert trees[0] is not None and engine.stats.fallback_steps == 0
    finally:
        engine.close()


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _certificates(root: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate (CN gamma)."""
    root.mkdir(parents=True, exist_ok=True)
    files = {name: root / name for name in ("ca.key", "ca.pem", "server.key", "server.pem",
                                             "client.key", "client.pem")}  # fmt: skip
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
             "-keyout", str(files["ca.key"]), "-out", str(files["ca.pem"]))  # fmt: skip
    for who, subject, extension in (
        ("server", "/CN=drafter", "subjectAltName=IP:127.0.0.1"),
        ("client", "/CN=gamma", "extendedKeyUsage=clientAuth"),
    ):
        csr = root / f"{who}.csr"
        ext = root / f"{who}.ext"
        ext.write_text(extension + "\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
                 "-keyout", str(files[f"{who}.key"]), "-out", str(csr))  # fmt: skip
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(files["ca.pem"]), "-CAkey",
                 str(files["ca.key"]), "-CAcreateserial", "-days", "2", "-extfile", str(ext),
                 "-out", str(files[f"{who}.pem"]))  # fmt: skip
    return files


def test_mutual_tls_admits_only_certified_clients(tmp_path: Path) -> None:
    certs = _certificates(tmp_path)
    server = DrafterProcess(
        tmp_path / "data", "--tls-cert-file", str(certs["server.pem"]), "--tls-key-file",
        str(certs["server.key"]), "--tls-client-ca-file", str(certs["ca.pem"]),
    )  # fmt: skip
    try:
        ca = certs["ca.pem"].read_bytes()
        anonymous = DrafterClient(server.target, deadline_ms=500,
                                  credentials=grpc.ssl_channel_credentials(ca))  # fmt: skip
        with pytest.raises(grpc.RpcError):  # the TLS handshake refuses a client without a cert
            anonymous.wait_ready(timeout_s=3)
        anonymous.close()
        settings = DrafterSettings(
            address=server.target, deadline_ms=1000, budget="4", tls_ca_file=str(certs["ca.pem"]),
            tls_cert_file=str(certs["client.pem"]), tls_key_file=str(certs["client.key"]),
        )  # fmt: skip
        engine = EngineDrafter(settings)
        try:
            context = [*PATTERN, *PATTERN]
            trees = engine.draft(["m1"], [len(context)], [len(context)],
                                 lambda row, a, b: context[a:b])  # fmt: skip
            assert trees[0] is not None and trees[0].best_chain(2) == [10, 11]
        finally:
            engine.close()
    finally:
        server.stop()


def test_a_changed_tokens_file_takes_effect_without_a_restart(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alpha {ALPHA}\n")
    server = DrafterProcess(tmp_path / "data", "--grpc-tokens-file", str(tokens))
    try:
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.DrafterServiceStub(channel)

            def code(token: str) -> grpc.StatusCode:
                bearer = (("authorization", f"Bearer {token}"),)
                try:
                    stub.GetServiceInfo(pb.GetServiceInfoRequest(), timeout=5, metadata=bearer)
                except grpc.RpcError as err:
                    return err.code()  # type: ignore[no-any-return]
                return grpc.StatusCode.OK

            ok, refused = grpc.StatusCode.OK, grpc.StatusCode.UNAUTHENTICATED
            assert (code(ALPHA), code(BETA)) == (ok, refused)
            tokens.write_text(f"beta {BETA}\n")  # alpha revoked, beta added
            time.sleep(1.2)  # the file is looked at again at most once a second
            assert (code(ALPHA), code(BETA)) == (refused, ok)
            tokens.write_text("garbage\n")  # a broken edit keeps the last good tokens
            time.sleep(1.2)
            assert code(BETA) == ok
    finally:
        server.stop()


def test_renewed_certificates_are_served_without_a_restart(tmp_path: Path) -> None:
    first, second = _certificates(tmp_path / "first"), _certificates(tmp_path / "second")
    live = {name: tmp_path / f"live-{name}" for name in ("server.pem", "server.key", "ca.pem")}
    for name, path in live.items():
        path.write_bytes(first[name].read_bytes())
    server = DrafterProcess(
        tmp_path / "data", "--tls-cert-file", str(live["server.pem"]), "--tls-key-file",
        str(live["server.key"]), "--tls-client-ca-file", str(live["ca.pem"]),
    )  # fmt: skip

    def ready(certs: dict[str, Path]) -> bool:
        settings = DrafterSettings(
            address=server.target, deadline_ms=1000, connect_timeout_s=0,
            tls_ca_file=str(certs["ca.pem"]), tls_cert_file=str(certs["client.pem"]),
            tls_key_file=str(certs["client.key"]),
        )  # fmt: skip
        tls, token = settings.credentials()
        client = DrafterClient(server.target, credentials=tls, token=token)
        try:
            client.wait_ready(timeout_s=3)
            return True
        except grpc.RpcError:
            return False
        finally:
            client.close(0.1)

    try:
        assert ready(first) and not ready(second)
        for name, path in live.items():  # what cert-manager does when it renews
            path.write_bytes(second[name].read_bytes())
        assert ready(second) and not ready(first)
    finally:
        server.stop()
